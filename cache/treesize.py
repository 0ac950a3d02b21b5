"""The sizes of a tree on disk, walked through descriptors: logical bytes, blocks on disk (each
inode once), and what only the tree holds.

*Logical* bytes are file sizes as if nothing were shared (every hardlink counting again); *disk*
bytes are allocated blocks (``st_blocks``), each inode counted once.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache.treewalk import path_stats


@dataclass(frozen=True)
class TreeSize:
    logical: int
    disk: int
    files: int


def tree_size(path: Path, seen: set[tuple[int, int]] | None = None,
              linked: dict[tuple[int, int], int] | None = None) -> TreeSize:
    """Sizes of everything under ``path`` (not following links); inodes in ``seen`` count once.

    Pass one ``seen`` set to several calls to count inodes shared between trees once overall.
    ``linked`` collects the bytes on disk of each inode counted here that has more than one
    link (what another tree may share). The walk goes through descriptors
    (:func:`ocistage.cache.treewalk.path_stats`): any depth, any path length.
    """
    seen = set() if seen is None else seen
    logical = disk = files = 0
    stats = path_stats(path)
    st = next(stats, None)
    if st is None:
        return TreeSize(0, 0, 0)
    if not stat.S_ISDIR(st.st_mode):
        seen.add((st.st_dev, st.st_ino))
        if linked is not None and st.st_nlink > 1:
            linked[(st.st_dev, st.st_ino)] = st.st_blocks * 512
        return TreeSize(st.st_size, st.st_blocks * 512, 1)
    disk += st.st_blocks * 512
    for est in stats:
        files += 1
        if stat.S_ISDIR(est.st_mode):
            disk += est.st_blocks * 512
            continue
        logical += est.st_size
        inode = (est.st_dev, est.st_ino)
        if inode not in seen:
            seen.add(inode)
            disk += est.st_blocks * 512
            if linked is not None and est.st_nlink > 1:
                linked[inode] = est.st_blocks * 512
    return TreeSize(logical, disk, files)


def tree_shares(path: Path) -> tuple[int, int]:
    """``path``'s bytes on disk (each inode once) and those only it holds: its directories and
    the files whose every link is inside it (none in a snapshot, another bundle or a staged
    copy). Both are the tree's own, whatever else is measured before or after it."""
    disk = unique = 0
    shared: dict[tuple[int, int], list[int]] = {}  # inode -> [links seen here, st_nlink, bytes]
    for st in path_stats(path):
        size = st.st_blocks * 512
        if stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1:
            disk += size
            unique += size
            continue
        found = shared.get((st.st_dev, st.st_ino))
        if found is None:
            shared[(st.st_dev, st.st_ino)] = [1, st.st_nlink, size]
        else:
            found[0] += 1
    for links, nlink, size in shared.values():
        disk += size
        unique += size if links >= nlink else 0
    return disk, unique

