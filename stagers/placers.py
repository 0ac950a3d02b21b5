"""Putting the regular files of a version into its scratch tree: one placer per staging method.

The staging method (:class:`~ocistage.stagers.target.Method`) is chosen once per stage;
:func:`placer_for` gives the placer that alone knows how that method places a file:

- :class:`HardlinkPlacer`: a ``link()`` of the source file (a copy where the link is refused);
- :class:`PoolPlacer`: a ``link()`` of the file's pool entry, copied into the pool first if the
  pool lacks the content; a first stage into an empty pool copies and hashes in one pass;
- :class:`CopyPlacer`: an independent copy; an unchanged file of the previous version is carried
  over by hardlink.

Every placer has two ways in, with one interface: :meth:`Placer.place` puts one file by its
paths (threads; the fallback of the other), :meth:`Placer.place_part` a slice of the files in
walk order, the common cases through descriptors of their directories (forked workers): no
path walk per file, no per-file decision beyond a dict lookup. The top-level ``config.json``
always goes through :meth:`Placer.place`: where the staged files share inodes (hardlink, pool)
it is written as a file of its own with a read-only root.

A placer changes no state but its copier's and its cache of descriptors of the previous
version, so a forked worker can run it on a slice of the files.
"""

from __future__ import annotations

import os
import stat
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path

from ocistage.cache.dirfds import DIR_FOLLOW, DIR_READ, identity
from ocistage.cache.fdio import process_umask
from ocistage.cache.linkprobes import link_refused
from ocistage.stagers.copy import Copier
from ocistage.stagers.filemanifest import Entry, hash_file
from ocistage.stagers.pool import Pool, pool_key
from ocistage.stagers.target import Method, readonly_config, writable_config, write_private

#: what placing a file did: "copied", "linked" or "unchanged", bytes copied, and the content
#: hash when it was computed on the way (a first stage into an empty pool)
Outcome = tuple[str, int, str | None]

#: the only file placed differently: rewritten as a private copy (see the module docstring)
CONFIG = "config.json"

_UNCHANGED: Outcome = ("unchanged", 0, None)
_LINKED: Outcome = ("linked", 0, None)


class OldVersion:
    """The previous version of the staged name, for carrying files over: each of its
    directories opened once, as a descriptor reached without following any symlink (a
    container may have planted one in a writable copy); shared by threads."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self._dirs: dict[str, int | None] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        for fd in self._dirs.values():
            if fd is not None:
                os.close(fd)
        self._dirs.clear()

    def dir_fd(self, rel_dir: str) -> int | None:
        """A descriptor of directory ``rel_dir`` of the previous version; None if it has none."""
        if rel_dir in self._dirs:  # a plain dict read: no lock needed once opened
            return self._dirs[rel_dir]
        with self._lock:
            return self._open(rel_dir)

    def _open(self, rel_dir: str) -> int | None:
        if rel_dir in self._dirs:
            return self._dirs[rel_dir]
        fd: int | None = None
        try:
            if not rel_dir:
                fd = os.open(self.final, DIR_READ)
            else:
                parent_rel, _, name = rel_dir.rpartition("/")
                parent = self._open(parent_rel)
                if parent is not None:
                    fd = os.open(name, DIR_READ, dir_fd=parent)
        except OSError:
            fd = None
        self._dirs[rel_dir] = fd
        return fd

    def link(self, entry: Entry, dest: str, any_size: bool = False) -> bool:
        """Hardlink the previous version's copy of ``entry`` at ``dest`` if it still is a
        plain file of the expected mode and size (``any_size``: of any size, a rewritten
        config.json); False if not (then it is made anew)."""
        rel_dir, _, name = entry.path.rpartition("/")
        fd = self.dir_fd(rel_dir)
        if fd is None:
            return False
        try:
            os.link(name, dest, src_dir_fd=fd, follow_symlinks=False)
        except OSError:
            return False
        st = os.lstat(dest)
        if (not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != entry.mode
                or (st.st_size != entry.size and not any_size)):
            os.unlink(dest)
            return False
        return True


    def link_private(self, entry: Entry, dest: str, data: bytes, source: str) -> bool:
        """Hardlink the previous version's private copy of ``entry`` (config.json) at
        ``dest`` if it still is one: a plain file of the mode, holding ``data``, and not the
        source's own inode (which a version staged before the private copy existed may
        link); False if not (then it is written anew)."""
        if not self.link(entry, dest, any_size=True):
            return False
        try:
            fd = os.open(dest, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                private = st.st_size == len(data) and identity(st) != identity(
                    os.stat(source, follow_symlinks=False)) and os.read(fd, len(data) + 1) == data
            finally:
                os.close(fd)
        except OSError:
            private = False
        if not private:
            os.unlink(dest)
        return private


class _Dirs:
    """The directory of the file being placed by :meth:`Placer.place_part`, as descriptors in
    the scratch tree and (opened on first use) in the source; reopened only when the directory
    changes (the files come in walk order). Read as attributes: no call per file."""

    __slots__ = ("_scratch_root", "_source_root", "current", "dest", "source")

    def __init__(self, scratch_root: int, source_root: int) -> None:
        self._scratch_root = scratch_root
        self._source_root = source_root
        self.current: str | None = None
        self.dest = self.source = -1

    def enter(self, rel_dir: str) -> None:
        self.close()
        # our own scratch tree: every directory in it was made by Builder.make_nodes()
        self.dest = os.open(rel_dir or ".", DIR_READ, dir_fd=self._scratch_root)
        self.current = rel_dir

    def open_source(self) -> None:
        assert self.current is not None
        self.source = os.open(self.current or ".", DIR_FOLLOW, dir_fd=self._source_root)

    def close(self) -> None:
        for fd in (self.dest, self.source):
            if fd >= 0:
                os.close(fd)
        self.dest = self.source = -1


class Placer(ABC):
    """How one staging method puts regular files into the scratch tree (module docstring).

    ``previous``: the previous version's entries by path; ``carry_over``: whether they were
    staged by this method and may be taken over (nothing is, otherwise).
    """

    def __init__(self, source: Path, scratch: Path, final: Path, previous: dict[str, Entry],
                 carry_over: bool, pool: Pool) -> None:
        self._source_text = os.fspath(source)  # entry paths are appended per file
        self._scratch_text = os.fspath(scratch)
        self.previous = previous
        self.carry_over = carry_over
        self.pool = pool
        self.copier = Copier()
        self.old = OldVersion(final)
        self._umask = process_umask()
        # descriptors that files are placed through (see place_part); -1: not opened
        self._scratch_fd = os.open(scratch, DIR_READ)
        self._source_fd = self._pool_fd = -1
        try:
            self._open(source)
        except BaseException:
            self.close()
            raise

    @abstractmethod
    def _open(self, source: Path) -> None:
        """Open the descriptors this method places files through, beside the scratch tree's."""

    def close(self) -> None:
        self.old.close()
        for fd in (self._scratch_fd, self._source_fd, self._pool_fd):
            if fd >= 0:
                os.close(fd)
        self._scratch_fd = self._source_fd = self._pool_fd = -1

    # -- the interface ---------------------------------------------------------------------

    @abstractmethod
    def place(self, entry: Entry) -> Outcome:
        """Put one regular file into the scratch tree by its paths; returns (what happened,
        bytes copied, the content hash if it was computed here)."""

    def place_part(self, part: Sequence[Entry]) -> list[Outcome]:
        """:meth:`place` for a slice of the files (in a forked worker, or here), the common
        cases through descriptors of the files' directories."""
        dirs = _Dirs(self._scratch_fd, self._source_fd)
        try:
            return [self._place_at(entry, dirs) for entry in part]
        finally:
            dirs.close()

    def _place_at(self, entry: Entry, dirs: _Dirs) -> Outcome:
        """One file of :meth:`place_part`; ``dirs`` is where the previous one was placed."""
        return self.place(entry)

    def weight(self) -> Callable[[Entry], int]:
        """The work of placing a file, to cut batches of equal work: a copy weighs its bytes;
        a re-stage of the same method links most files (all hashes known): count them
        equally."""
        if self.carry_over:
            return lambda e: 0 if e.hash is not None else e.size
        return lambda e: e.size

    def copies_some(self, files: Sequence[Entry]) -> bool:
        """Whether some of ``files`` may be copied (threads help), not only linked."""
        return bool(files)

    def groups(self, files: list[Entry]) -> tuple[list[Entry], list[tuple[Entry, Entry]]]:
        """``files`` as those to place and (file, first of its group) pairs of hardlink
        groups inside the source, made by linking the first's placed file."""
        return files, []

    # -- shared steps ----------------------------------------------------------------------

    def _paths(self, entry: Entry) -> tuple[str, str]:
        return f"{self._source_text}/{entry.path}", f"{self._scratch_text}/{entry.path}"

    def _rewrite_config(self, data: bytes) -> bytes | None:
        """config.json as a file of this method's own, or None to stage it as it is."""
        return readonly_config(data)

    def _config_data(self, src: str, entry: Entry) -> bytes | None:
        """config.json as a file of this method's own (:meth:`_rewrite_config`), or None when
        the source's config.json can be staged as it is."""
        if entry.size > 16 << 20:
            return None
        with open(src, "rb") as file:
            return self._rewrite_config(file.read())

    def _private_config(self, src: str, dest: str, entry: Entry) -> Outcome | None:
        """Write config.json as a file of its own (:meth:`_config_data`): what that did, or
        None when the source's config.json can be staged as it is."""
        data = self._config_data(src, entry)
        if data is None:
            return None
        return self._write_config(src, dest, entry, data)

    def _write_config(self, src: str, dest: str, entry: Entry, data: bytes) -> Outcome:
        write_private(Path(dest), data)
        os.chmod(dest, entry.mode)
        return "copied", len(data), hash_file(src) if entry.hash is None else None


class _SharedPlacer(Placer):
    """A method whose staged files share inodes (with the source, or with other bundles
    through the pool): config.json gets a read-only root, in a file of its own."""

    def place(self, entry: Entry) -> Outcome:
        src, dest = self._paths(entry)
        same = self._same(entry)
        if entry.path == CONFIG:
            data = self._config_data(src, entry)
            if data is not None:  # a private copy: the previous one if it still is that
                if same and self.old.link_private(entry, dest, data, src):
                    return _UNCHANGED
                return self._write_config(src, dest, entry, data)
        return self._place_file(entry, src, dest, same)

    @abstractmethod
    def _same(self, entry: Entry) -> bool:
        """Whether the previous version staged ``entry`` as it is now."""

    @abstractmethod
    def _place_file(self, entry: Entry, src: str, dest: str, same: bool) -> Outcome:
        """:meth:`place` of a file placed as the method places any (``same``: unchanged)."""


class HardlinkPlacer(_SharedPlacer):
    """``hardlink``: the staged file is the source's inode (a hardlink version carries no
    content hashes: the source inode itself is staged, unchanged when its stat is)."""

    def _open(self, source: Path) -> None:
        self._source_fd = os.open(source, DIR_FOLLOW)

    def _same(self, entry: Entry) -> bool:
        before = self.previous.get(entry.path)
        return self.carry_over and before is not None and before.same_stat(entry)

    def _place_file(self, entry: Entry, src: str, dest: str, same: bool) -> Outcome:
        # unchanged: the previous version linked this very file
        outcome = _UNCHANGED if same else _LINKED
        try:
            os.link(src, dest, follow_symlinks=False)
        except OSError as exc:
            if not link_refused(exc):
                raise
            return self._copy(src, dest, entry)
        return outcome

    def _copy(self, src: str, dest: str, entry: Entry) -> Outcome:
        """A copy where the link is refused (a mount point inside the source, EXDEV; a file
        at its link limit)."""
        self.copier.copy_new(src, dest, entry.mode, entry.mtime_ns, xattrs=True)
        return "copied", entry.size, None

    def _place_at(self, entry: Entry, dirs: _Dirs) -> Outcome:
        if entry.path == CONFIG:  # may be written as a private copy
            return self.place(entry)
        rel_dir, _, name = entry.path.rpartition("/")
        if rel_dir != dirs.current:
            dirs.enter(rel_dir)
            dirs.open_source()
        before = self.previous.get(entry.path)
        same = self.carry_over and before is not None and before.same_stat(entry)
        try:
            os.link(name, name, src_dir_fd=dirs.source, dst_dir_fd=dirs.dest,
                    follow_symlinks=False)
        except OSError as exc:
            if not link_refused(exc):
                raise
            return self.place(entry)  # copies where links fail
        return _UNCHANGED if same else _LINKED

    def weight(self) -> Callable[[Entry], int]:
        return lambda e: 0  # a link: only its per-file cost

    def copies_some(self, files: Sequence[Entry]) -> bool:
        return any(entry.path == CONFIG for entry in files)


class PoolPlacer(_SharedPlacer):
    """``pool``: the staged file is a link of the pool entry of its (content, mode)."""

    def _open(self, source: Path) -> None:
        self._source_fd = os.open(source, DIR_FOLLOW)
        self._pool_fd = os.open(self.pool.root, DIR_READ)
        self._pool_dev = os.fstat(self._pool_fd).st_dev
        self._euid = os.geteuid()  # whose pool entries may be linked (Pool.entry_problem)

    def _same(self, entry: Entry) -> bool:
        before = self.previous.get(entry.path)
        return self.carry_over and before is not None and before.same_content(entry)

    def _place_file(self, entry: Entry, src: str, dest: str, same: bool) -> Outcome:
        if same:  # linked from the pool, as before
            assert entry.hash is not None
            self.pool.link_into(src, pool_key(entry.hash, entry.mode, entry.xattrs), entry.mode,
                                entry.mtime_ns, dest, self.copier)
            return _UNCHANGED
        if entry.hash is None:  # first stage: copy + hash at once
            content_hash, new = self.pool.ingest(src, entry.mode, entry.mtime_ns, dest,
                                                 entry.size, umask=self._umask,
                                                 xattr_digest=entry.xattrs, copier=self.copier)
            return ("copied", entry.size, content_hash) if new else ("linked", 0, content_hash)
        if self.pool.link_into(src, pool_key(entry.hash, entry.mode, entry.xattrs), entry.mode,
                               entry.mtime_ns, dest, self.copier):
            return "copied", entry.size, None
        return _LINKED

    def _linked_unchanged(self, entry: Entry) -> bool:
        """Whether ``entry`` is linked from the pool as before, by :meth:`_place_at`."""
        if not self.carry_over or entry.hash is None:
            return False
        before = self.previous.get(entry.path)
        return before is not None and before.same_content(entry)

    def place_part(self, part: Sequence[Entry]) -> list[Outcome]:
        """:meth:`Placer.place_part`, the files a re-stage carries over unchanged (nearly all
        of a 1%-changed tree) in one loop: a file whose previous entry has the same content
        (:meth:`Entry.same_content`) is linked from its pool entry (:func:`pool_key`) without
        that entry being read when the result passes :meth:`_pool_entry_ok`'s checks — a
        regular file of ours of the entry's mode and size, the very inode the previous
        version linked at its path — with one ``link()`` and one ``lstat`` per file, as
        ``cp -al``. The ``lstat`` is of the link made, in our own scratch dir (what was
        linked is what is checked: a pool entry swapped meanwhile is seen); the previous
        version's inode at the path is its directory's listing's (:meth:`old_inodes`, one
        ``getdents`` per directory), not a second ``lstat``. Any other file, and one that
        failed a check (its link removed again) or a call, by :meth:`_place_at`, which
        checks again and hashes, copies or raises as it does."""
        if not self.carry_over:
            return super().place_part(part)
        dirs = _Dirs(self._scratch_fd, self._source_fd)
        get, place, old_inodes = self.previous.get, self._place_at, self.old_inodes
        link_unchanged = self.link_unchanged
        outcomes: list[Outcome] = []
        add = outcomes.append
        current: str | None = None
        old: dict[str, int] = {}
        try:
            for entry in part:
                path, _kind, mode, size, _mtime, _dev, _ino, digest, _target, _ctime, xattrs \
                    = entry
                before = get(path)
                if (digest is None or path == CONFIG or before is None
                        or not before.same_content(entry)):
                    add(place(entry, dirs))
                    continue
                rel_dir, _, name = path.rpartition("/")
                if rel_dir != dirs.current:  # (_place_at may have entered another)
                    dirs.enter(rel_dir)
                if rel_dir != current:
                    current, old = rel_dir, old_inodes(rel_dir)
                was = old.get(name)
                if was is None or not link_unchanged(name, pool_key(digest, mode, xattrs), was,
                                                     mode, size, dirs.dest):
                    add(place(entry, dirs))  # placed (or copied) as any other
                    continue
                add(_UNCHANGED)
            return outcomes
        finally:
            dirs.close()

    def link_unchanged(self, name: str, key: str, was: int, mode: int, size: int,
                       dest: int) -> bool:
        """Link pool entry ``key`` as ``name`` into the scratch directory ``dest`` if it is
        the previous version's file there (inode ``was``, from :meth:`old_inodes`): what was
        linked, seen in our own scratch dir (no one else can swap it), must be that inode,
        on the pool's filesystem, a regular file of ours of ``mode`` and ``size``. False if
        not (the link made is removed again) or the link failed: placed as any other."""
        try:
            os.link(f"{key[:2]}/{key}", name, src_dir_fd=self._pool_fd, dst_dir_fd=dest,
                    follow_symlinks=False)
        except OSError:  # none, or refused
            return False
        st = os.stat(name, dir_fd=dest, follow_symlinks=False)
        if (st.st_ino != was or st.st_dev != self._pool_dev
                or st.st_mode != stat.S_IFREG | mode or st.st_uid != self._euid
                or st.st_size != size):
            os.unlink(name, dir_fd=dest)
            return False
        return True

    def old_inodes(self, rel_dir: str) -> dict[str, int]:
        """The entries of the previous version's directory ``rel_dir`` by name, with their
        inode numbers as its listing gives them (``d_ino``: no ``lstat``; :meth:`place_part`
        links a pool entry only if it is that inode, and a regular file); empty when it has
        no such directory or the directory is not on the pool's filesystem (an inode number
        is the pool entry's only on the same one). A listing that does not give true inode
        numbers (overlayfs across layers) only makes files miss this path: :meth:`_place_at`
        checks them again."""
        old = self.old.dir_fd(rel_dir)
        try:
            if old is None or os.fstat(old).st_dev != self._pool_dev:
                return {}
            with os.scandir(old) as listing:
                return {e.name: e.inode() for e in listing}
        except OSError:
            return {}

    def _place_at(self, entry: Entry, dirs: _Dirs) -> Outcome:
        if entry.path == CONFIG:  # may be written as a private copy
            return self.place(entry)
        if entry.hash is None:  # with no previous version: hashed while it is copied
            return self._ingest_at(entry, dirs) if not self.previous else self.place(entry)
        before = self.previous.get(entry.path)  # _linked_unchanged(), without a call per file
        if self.carry_over and before is not None and before.same_content(entry):
            return self._link_pooled_at(entry, dirs)
        return self.place(entry)

    def _ingest_at(self, entry: Entry, dirs: _Dirs) -> Outcome:
        """Copy ``entry`` into an empty pool while hashing it, through ``dirs``."""
        rel_dir, _, name = entry.path.rpartition("/")
        if rel_dir != dirs.current:
            dirs.enter(rel_dir)
        if dirs.source < 0:
            dirs.open_source()
        content_hash, new = self.pool.ingest(
            name, entry.mode, entry.mtime_ns, name, entry.size, source_dir=dirs.source,
            dest_dir=dirs.dest, umask=self._umask, xattr_digest=entry.xattrs,
            copier=self.copier)
        return ("copied", entry.size, content_hash) if new else ("linked", 0, content_hash)

    def _link_pooled_at(self, entry: Entry, dirs: _Dirs) -> Outcome:
        """Link the pool entry of the unchanged ``entry`` through ``dirs``."""
        assert entry.hash is not None
        rel_dir, _, name = entry.path.rpartition("/")
        if rel_dir != dirs.current:
            dirs.enter(rel_dir)
        key = pool_key(entry.hash, entry.mode, entry.xattrs)
        if not self._pool_entry_ok(entry, key, rel_dir, name):
            return self.place(entry)  # verified, or a private copy
        try:
            os.link(f"{key[:2]}/{key}", name, src_dir_fd=self._pool_fd, dst_dir_fd=dirs.dest,
                    follow_symlinks=False)
        except OSError as exc:  # released meanwhile, or refused: copy again
            if not (isinstance(exc, FileNotFoundError) or link_refused(exc)):
                raise
            return self.place(entry)
        return _UNCHANGED

    def _pool_entry_ok(self, entry: Entry, key: str, rel_dir: str, name: str) -> bool:
        """Whether pool entry ``key`` may be linked for the unchanged ``entry``: a regular
        file of ours with the right mode and size, and either the very inode the previous
        version linked (verified then) or holding the right content (hashed now)."""
        pooled = f"{key[:2]}/{key}"
        try:  # one lstat of the entry serves both checks below
            st = os.stat(pooled, dir_fd=self._pool_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if self.pool.entry_problem(pooled, key, entry.size, dir_fd=self._pool_fd,
                                   content=False, st=st) is not None:
            return False
        old = self.old.dir_fd(rel_dir)
        try:
            if old is not None and identity(os.stat(name, dir_fd=old, follow_symlinks=False)) \
                    == identity(st):
                return True
        except OSError:
            pass
        return self.pool.entry_problem(pooled, key, entry.size, dir_fd=self._pool_fd,
                                       st=st) is None

    def copies_some(self, files: Sequence[Entry]) -> bool:
        return any(entry.path == CONFIG or not self._linked_unchanged(entry)
                   for entry in files)


class CopyPlacer(Placer):
    """``copy``: an independent file; an unchanged one carried over from the previous
    version by hardlink (which the switch then moves: the old version is removed)."""

    def _open(self, source: Path) -> None:
        """Nothing: copies are made by path (:class:`~ocistage.stagers.copy.Copier`)."""

    def place(self, entry: Entry) -> Outcome:
        src, dest = self._paths(entry)
        before = self.previous.get(entry.path)
        if self.carry_over and before is not None and before.same_content(entry) \
                and self.old.link(entry, dest):
            return _UNCHANGED
        if entry.path == CONFIG:
            written = self._private_config(src, dest, entry)
            if written is not None:
                return written
        self.copier.copy_new(src, dest, entry.mode, entry.mtime_ns, bool(entry.xattrs))
        return "copied", entry.size, None

    def _rewrite_config(self, data: bytes) -> bytes | None:
        return writable_config(data)  # writable again if it was read-only only for sharing

    def groups(self, files: list[Entry]) -> tuple[list[Entry], list[tuple[Entry, Entry]]]:
        firsts: dict[tuple[int, int], Entry] = {}
        singles: list[Entry] = []
        groups: list[tuple[Entry, Entry]] = []
        for entry in files:
            key = (entry.dev, entry.ino)
            if key in firsts:
                groups.append((entry, firsts[key]))  # hardlink group inside the source
            else:
                firsts[key] = entry
                singles.append(entry)
        return singles, groups


_PLACERS: dict[Method, type[Placer]] = {
    Method.HARDLINK: HardlinkPlacer,
    Method.POOL: PoolPlacer,
    Method.COPY: CopyPlacer,
}


def placer_for(method: Method) -> type[Placer]:
    """The placer of ``method``."""
    return _PLACERS[method]
