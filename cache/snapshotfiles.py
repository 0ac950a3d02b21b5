"""What identifies every entry of a published snapshot, and the check that nothing changed it.

A bundle made with hard links (``bundle REF`` without DEST, ``bundle --link``) shares its
files' inodes with the snapshot it was cloned from. Its root is read-only in ``config.json``,
but a user on the host (or a container run with another config) can still open one of its
files for writing in place (``echo x >> rootfs/etc/passwd``, ``open(O_TRUNC)``) or ``chmod``
it: that changes the snapshot and every bundle linked to it. So:

- when a snapshot is published, :func:`write_record` walks its tree and records, for every
  entry, in ``snapshots/<hex>/snapshot.files``, what such a change always alters: type and
  mode, owner, inode number and, for all but directories, size and mtime (in ns);
- :func:`check` walks the tree again (the same fd-based walk, in the same order) and compares,
  naming the first :data:`MAX_LISTED` differences. ``find_snapshot`` runs it before a bundle
  or a newer snapshot is made from a snapshot, ``cache verify`` on every snapshot;
- a changed snapshot is moved to ``CACHE/quarantine`` (it holds what was written, for a
  post-mortem) together with the cached bundles that share a changed inode
  (:func:`linked_bundles`), so the next bundle of the image is made from a snapshot rebuilt
  from the verified blobs instead of inheriting the change.

Not ctime: ``link()`` and ``unlink()`` set the ctime of the inode they (un)link, so every bundle
cloned from a snapshot, and every bundle removed, changes the ctime of all its files. An
in-place write sets the mtime to the time of the write (``cp -p`` over a file: to the source's),
an append or a truncation changes the size; what escapes is a writer who rewrites a file to
the same size and then deliberately sets the old mtime back, to the nanosecond: someone who
can write the cache, who can change the snapshot itself anyway (docs/trust.md).

The record: a header line, then per entry ``relative path NUL fields NUL``, the fields
``mode uid gid inode size mtime_ns`` in decimal (size and mtime 0 for a directory), in the
order of :func:`ocistage.cache.treewalk.walk_entries`: both sides of a check are streamed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ocistage.cache.dirfds import open_parent
from ocistage.cache.errors import StoreError
from ocistage.cache.evict import evict
from ocistage.cache.store import BUNDLES, Store, quarantine
from ocistage.cache.treewalk import walk_entries

FILES = "snapshot.files"
HEADER = b"ocistage snapshot files 1\n"
MAX_LISTED = 16          # changes named (and used to find linked bundles); all are counted
_CHUNK = 1 << 18
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

Fields = tuple[int, int, int, int, int, int]   # mode, uid, gid, inode, size, mtime_ns
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    path: str       # relative to the rootfs
    detail: str     # "size 10 -> 12, modified at ...", "removed", "added"
    inode: int      # the recorded inode of a changed non-directory (shared with bundles), or 0


@dataclass(frozen=True)
class Check:
    changes: tuple[Change, ...]   # the first MAX_LISTED differences
    count: int                    # all of them

    @property
    def unchanged(self) -> bool:
        return self.count == 0

    def describe(self) -> str:
        named = "; ".join(f"{change.path}: {change.detail}" for change in self.changes)
        more = f"; and {self.count - len(self.changes)} more" if self.count > len(
            self.changes) else ""
        entries = "1 entry" if self.count == 1 else f"{self.count} entries"
        return f"{entries} changed since it was published ({named}{more})"


def write_record(directory: Path) -> None:
    """Record the entries of ``directory/rootfs`` in ``directory/snapshot.files`` (which must
    not exist yet); called on a snapshot's scratch directory before it is published."""
    fd = os.open(directory / FILES, _NEW_FILE, 0o644)
    with os.fdopen(fd, "wb") as out, contextlib.closing(_blocks(directory / "rootfs")) as tree:
        out.write(HEADER)
        for block in tree:
            out.write(block)


def check(directory: Path) -> Check | None:
    """Compare the snapshot at ``directory`` with its record; None if it has none (made by an
    older ocistage) or one of another format. Raises OSError if the tree cannot be walked:
    PermissionError where the caller may not read part of it (another member's snapshot
    of an image with 0700 directories, in a group-shared cache), which is "cannot check",
    never "changed".

    The tree is written out as its record would be and compared with it, directory by
    directory; only a snapshot that differs is walked again to name the differences.
    """
    try:
        fd = os.open(directory / FILES, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as file:
        if file.readline(len(HEADER)) != HEADER:
            return None
        if _same(file, directory / "rootfs"):
            return Check((), 0)
        file.seek(len(HEADER))
        return _differences(file, directory / "rootfs")


def _same(file: BinaryIO, rootfs: Path) -> bool:
    with contextlib.closing(_blocks(rootfs)) as tree:
        for block in tree:
            if file.read(len(block)) != block:
                return False
    return file.read(1) == b""


def _differences(file: BinaryIO, rootfs: Path) -> Check:
    changes: list[Change] = []
    count = 0
    with contextlib.closing(_entries(rootfs)) as tree:
        try:
            for change in _diff(_recorded(file), tree):
                count += 1
                if len(changes) < MAX_LISTED:
                    changes.append(change)
        except ValueError:
            return Check((Change(FILES, "the record is damaged", 0),), 1)
    return Check(tuple(changes), count)


def linked_bundles(store: Store, directory: Path, found: Check) -> list[Path]:
    """The cached bundles (``CACHE/bundles/<key>``) whose rootfs holds one of the changed
    inodes that :func:`check` named for the snapshot at ``directory``: they share the change.
    Bundles linked elsewhere (``bundle --link DEST``) are not known to the cache."""
    shared = [(change.path, change.inode) for change in found.changes if change.inode]
    try:
        device = os.lstat(directory / "rootfs").st_dev
    except OSError:
        return []
    linked: list[Path] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(store.root / BUNDLES) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            if any(_is_inode(Path(entry.path, "rootfs", rel), device, inode)
                   for rel, inode in shared):
                linked.append(Path(entry.path))
    return sorted(linked)


def set_aside(store: Store, directory: Path, found: Check) -> None:
    """Quarantine the changed snapshot at ``directory`` (StoreError if it cannot be moved)
    and the cached bundles that share its change (one that cannot be moved is a warning), and
    warn; what another process moved first is fine."""
    bundles = linked_bundles(store, directory, found)
    moved = _quarantine_if_there(store, directory, "snapshot")
    count = 0
    for bundle in bundles:
        try:
            count += _quarantine_if_there(store, bundle, "bundle") is not None
        except StoreError as exc:
            log.warning("%s (it shares the changed files of snapshot %s)", exc, directory.name)
    if moved is not None:
        log.warning("snapshot %s: %s; moved to %s (cached bundles sharing the change, "
                    "moved too: %d); it is made again from the verified blobs", directory.name,
                    found.describe(), moved, count)


def _quarantine_if_there(store: Store, path: Path, label: str) -> Path | None:
    """Quarantine ``path``; None if it is gone. Another member's tree that the caller may not
    move to another directory (that needs write access to the tree itself) is evicted by a
    rename beside it instead (:mod:`ocistage.cache.evict`): it is out of the way all the same,
    and its owner's next command removes it."""
    try:
        return quarantine(store, path, label)
    except StoreError:
        if not os.path.lexists(path):
            return None
        try:
            return evict(path)
        except OSError:
            pass
        raise


def _is_inode(path: Path, device: int, inode: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (device, inode)


# -- the record and the tree, as two streams in one order ------------------------------------

def _blocks(rootfs: Path) -> Generator[bytes, None, None]:
    """The record of the tree at ``rootfs`` (without its header), a directory at a time."""
    parent_fd, name = open_parent(rootfs)
    try:
        for rel, entries in walk_entries(parent_fd, name, readable=True):
            prefix = f"{rel}/" if rel else ""
            yield b"".join(b"%s\0%d %d %d %d %d %d\0" % (os.fsencode(prefix + entry),
                                                         *_fields(st))
                           for entry, st in entries)
    finally:
        os.close(parent_fd)


def _entries(rootfs: Path) -> Generator[tuple[str, Fields], None, None]:
    parent_fd, name = open_parent(rootfs)
    try:
        for rel, entries in walk_entries(parent_fd, name, readable=True):
            prefix = f"{rel}/" if rel else ""
            for entry, st in entries:
                yield prefix + entry, _fields(st)
    finally:
        os.close(parent_fd)


def _fields(st: os.stat_result) -> Fields:
    if stat.S_ISDIR(st.st_mode):  # not shared with bundles; its mtime is its entry list
        return st.st_mode, st.st_uid, st.st_gid, st.st_ino, 0, 0
    return st.st_mode, st.st_uid, st.st_gid, st.st_ino, st.st_size, st.st_mtime_ns


def _recorded(file: BinaryIO) -> Iterator[tuple[str, Fields]]:
    """The entries of a record (after its header); ValueError if it is damaged."""
    rest = b""
    while chunk := file.read(_CHUNK):
        tokens = (rest + chunk).split(b"\0")
        rest = tokens.pop()
        if len(tokens) % 2:
            rest = tokens.pop() + b"\0" + rest
        for index in range(0, len(tokens), 2):
            yield os.fsdecode(tokens[index]), _parse(tokens[index + 1])
    if rest:
        raise ValueError("the record ends in the middle of an entry")


def _parse(text: bytes) -> Fields:
    values = tuple(int(value) for value in text.split(b" "))
    if len(values) != 6:
        raise ValueError(f"an entry of {len(values)} fields")
    return values


def _order(rel: str) -> tuple[list[str], str]:
    """Where ``rel`` comes in a walk: by its directory's components, then by its name."""
    parent, _, name = rel.rpartition("/")
    return parent.split("/") if parent else [], name


def _diff(recorded: Iterator[tuple[str, Fields]], current: Iterator[tuple[str, Fields]]
          ) -> Iterator[Change]:
    """The differences between two streams of entries in walk order (a merge)."""
    old = next(recorded, None)
    new = next(current, None)
    while old is not None or new is not None:
        if old is not None and new is not None and old[0] == new[0]:
            if old[1] != new[1]:
                yield Change(old[0], _what_changed(old[1], new[1]), _shared_inode(old[1]))
            old, new = next(recorded, None), next(current, None)
        elif old is not None and (new is None or _order(old[0]) < _order(new[0])):
            yield Change(old[0], "removed", _shared_inode(old[1]))
            old = next(recorded, None)
        elif new is not None:
            yield Change(new[0], "added", 0)
            new = next(current, None)


def _shared_inode(fields: Fields) -> int:
    return 0 if stat.S_ISDIR(fields[0]) else fields[3]


def _what_changed(old: Fields, new: Fields) -> str:
    parts = []
    if old[3] != new[3]:
        parts.append("replaced (another inode)")
    if old[0] != new[0]:
        parts.append(f"mode {old[0]:o} -> {new[0]:o}")
    if old[1:3] != new[1:3]:
        parts.append(f"owner {old[1]}:{old[2]} -> {new[1]}:{new[2]}")
    if old[4] != new[4]:
        parts.append(f"size {old[4]} -> {new[4]}")
    if old[5] != new[5]:
        written = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(new[5] // 1_000_000_000))
        parts.append(f"modified at {written}")
    return ", ".join(parts)
