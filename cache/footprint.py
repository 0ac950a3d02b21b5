"""What the cache occupies on disk, counted as ``du`` counts it, and what removing parts frees.

:func:`measure` takes the cache apart into *parts*: each entry of the cache's directories (a
blob, a layer snapshot, a cached bundle, a scratch dir, a partial download, a lease, a last-use
record, ``index.json``, ...), each measured in blocks on disk. A file counts once however many
links it has, as ``du`` counts it: a file hard-linked between a snapshot and a bundle stays
counted until the last part that links it is dropped. So dropping a part frees its directories,
its files with one link, and those of its linked files that no remaining part links; dropping
parts in any order frees, all told, exactly what they held, and :meth:`Footprint.size` is what
``du -s`` of the cache shows once the dropped parts are gone.

Blocks still allocated because something outside the cache links the same file (a bundle
staged by hardlinks on the same filesystem) are out of the cache's ``du`` once the cache's own
link is gone, and are counted so.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache.treesize import tree_size

# an inode: its number on the cache's own device (most), (device, number) elsewhere
Inode = int | tuple[int, int]

# directories whose entries are parts of their own (the directories themselves stay)
CONTAINERS = ("", "blobs", "blobs/sha256", "blobs/sha512", "bundles", "snapshots", "tmp",
              "ingest", "leases", "used", "quarantine", "pyxis", "pyxis/refs")
# where content lives; the rest (the directories, index.json, leases, last-use records) is the
# floor under which no GC can bring the cache
CONTENT = frozenset({"blobs", "bundles", "snapshots", "tmp", "ingest", "quarantine", "pyxis"})


@dataclass(frozen=True)
class _Part:
    own: int                    # directories and files with one link: freed with the part
    linked: tuple[Inode, ...]   # files with more links: freed with the last part holding them


class Footprint:
    """The parts of one cache and the running total of those not dropped."""

    def __init__(self, root: Path) -> None:
        self.root = root
        st = os.stat(root)
        self._dev = st.st_dev
        self._block = st.st_blksize
        self._parts: dict[str, _Part] = {}
        self._blocks: dict[Inode, int] = {}   # bytes on disk of each linked inode
        self._holders: dict[Inode, int] = {}  # live parts linking it
        self._freed: dict[str, int] = {}      # dropped parts: what dropping them freed
        self._size = 0
        self._floor = 0

    def _key(self, path: Path | str) -> str:
        return os.path.relpath(path, self.root)

    def add(self, path: Path) -> None:
        """Measure ``path`` (a file or a tree inside the cache) as one part."""
        found: dict[tuple[int, int], int] = {}
        disk = tree_size(path, linked=found).disk
        linked: dict[Inode, int] = {(ino if dev == self._dev else (dev, ino)): blocks
                                    for (dev, ino), blocks in found.items()}
        del found
        part = _Part(own=disk - sum(linked.values()), linked=tuple(linked))
        key = self._key(path)
        self._parts[key] = part
        self._size += part.own
        if not _is_content(key):
            self._floor += part.own
        for inode, blocks in linked.items():
            if self._holders.get(inode, 0) == 0:
                self._size += blocks
            self._blocks[inode] = blocks
            self._holders[inode] = self._holders.get(inode, 0) + 1

    def add_fixed(self, blocks: int) -> None:
        """Bytes that no part holds (the containers' own directories)."""
        self._size += blocks
        self._floor += blocks

    def size(self) -> int:
        """Bytes on disk of everything not dropped."""
        return self._size

    def floor(self) -> int:
        """Bytes of what is not content: the directories and records of what is not dropped."""
        return self._floor

    def drop(self, path: Path | str) -> int:
        """Forget the part at ``path``; return the bytes that frees (0 for an unknown path;
        the first answer again for a part already dropped)."""
        key = self._key(path)
        if key in self._freed:
            return self._freed[key]
        part = self._parts.pop(key, None)
        if part is None:
            return 0
        freed = part.own
        for inode in part.linked:
            self._holders[inode] -= 1
            if self._holders[inode] == 0:
                freed += self._blocks[inode]
        self._size -= freed
        if not _is_content(key):
            self._floor -= part.own
        self._freed[key] = freed
        return freed

    def predict(self, path: Path, size: int) -> None:
        """Count the file at ``path`` (one link) as if (re)written with ``size`` bytes: whole
        blocks of the cache's filesystem (a dry run's estimate of what the real run measures)."""
        key = self._key(path)
        part = self._parts.get(key, _Part(own=0, linked=()))
        own = -(-size // self._block) * self._block
        self._parts[key] = _Part(own=own, linked=part.linked)
        self._size += own - part.own
        if not _is_content(key):
            self._floor += own - part.own

    def has(self, path: Path) -> bool:
        return self._key(path) in self._parts

    def refresh(self, path: Path) -> None:
        """Measure the part at ``path`` again (a file rewritten in place, ``index.json``)."""
        key = self._key(path)
        if key in self._parts:
            self.drop(path)
            del self._freed[key]
        self.add(path)


def _is_content(key: str) -> bool:
    return key.partition(os.sep)[0] in CONTENT


def measure(root: Path, skip: tuple[str, ...] = ()) -> Footprint:
    """The parts of the cache at ``root``: every entry of :data:`CONTAINERS` (other than a
    container) is one, measured once; ``skip`` names top-level entries left out (GC's lock)."""
    footprint = Footprint(root)
    containers = {os.path.normpath(root / name) for name in CONTAINERS}
    pending = [root]
    while pending:
        directory = pending.pop()
        with contextlib.suppress(FileNotFoundError):
            footprint.add_fixed(os.lstat(directory).st_blocks * 512)
        children: list[Path] = []
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), \
                os.scandir(directory) as entries:
            children = [Path(entry.path) for entry in entries
                        if not (directory == root and entry.name in skip)]
        for child in children:
            if os.path.normpath(child) in containers and child.is_dir() and not child.is_symlink():
                pending.append(child)
            else:
                footprint.add(child)
    return footprint
