"""Building one version of a staged tree in its scratch directory: directories, symlinks and
fifos first, then every regular file by the staging method (hardlink from the source, via the
target's pool, or an independent copy; unchanged files of the previous version carried over),
then the times and modes of directories, children before parents.

:class:`Builder` holds what placing a file needs (descriptors of the scratch tree, the source
or the pool, the previous version's entries). Its per-file work runs in threads or forked
workers (:mod:`ocistage.stagers.parallel`): it changes no state but its copier's and its cache of
descriptors of the previous version, so a fork can run it on a slice of the files.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache.cpus import usable_cpus
from ocistage.cache.fdio import process_umask
from ocistage.cache.fsops import DIR_FOLLOW, DIR_READ, identity, link_refused
from ocistage.stagers.copy import Copier
from ocistage.stagers.filemanifest import Entry, Manifest, hash_file
from ocistage.stagers.parallel import map_batched, map_parts
from ocistage.stagers.pool import Pool, pool_key
from ocistage.stagers.target import Method, readonly_config, writable_config, write_private

#: what placing a file did: "copied", "linked" or "unchanged", bytes copied, and the content
#: hash when it was computed on the way (a first stage into an empty pool)
Outcome = tuple[str, int, str | None]

#: below this many files, forking workers costs more than it saves (threads are used)
FORK_MIN_FILES = 2000


@dataclass
class Counts:
    copied: int = 0
    linked: int = 0
    unchanged: int = 0
    bytes_copied: int = 0


class Builder:
    def __init__(self, source: Path, scratch: Path, final: Path, method: Method,
                 previous: Manifest | None, pool: Pool, jobs: int,
                 old: dict[str, Entry] | None = None) -> None:
        self.source = source
        self.scratch = scratch
        self._source_text = os.fspath(source)    # entry paths are appended per file
        self._scratch_text = os.fspath(scratch)
        self.final = final
        self.method = method
        if old is None:
            old = previous.by_path() if previous is not None else {}
        self.previous = old
        self.carry_over = previous is not None and previous.method == method
        self.pool = pool
        self.jobs = jobs
        self.counts = Counts()
        self.copier = Copier()
        self.hashes: dict[str, str] = {}  # computed while copying (first stage into a pool)
        self.replaced: list[Entry] = []  # files not staged unchanged (new or changed)
        self._old_dirs: dict[str, int | None] = {}
        self._old_dirs_lock = threading.Lock()
        # descriptors that files are linked through (see place_part); -1: not opened
        self._scratch_fd = os.open(scratch, DIR_READ)
        self._source_fd = self._pool_fd = -1
        self._umask = process_umask()
        try:
            if method != "copy":
                self._source_fd = os.open(source, DIR_FOLLOW)
            if method == "pool":
                self._pool_fd = os.open(pool.root, DIR_READ)
        except BaseException:
            os.close(self._scratch_fd)
            raise

    def close(self) -> None:
        for fd in self._old_dirs.values():
            if fd is not None:
                os.close(fd)
        self._old_dirs.clear()
        for fd in (self._scratch_fd, self._source_fd, self._pool_fd):
            if fd >= 0:
                os.close(fd)
        self._scratch_fd = self._source_fd = self._pool_fd = -1

    def _old_dir(self, rel_dir: str) -> int | None:
        """A descriptor of directory ``rel_dir`` of the previous version, reached without
        following any symlink (a container may have planted one in a writable copy)."""
        if rel_dir in self._old_dirs:  # a plain dict read: no lock needed once opened
            return self._old_dirs[rel_dir]
        with self._old_dirs_lock:
            return self._open_old_dir(rel_dir)

    def _open_old_dir(self, rel_dir: str) -> int | None:
        if rel_dir in self._old_dirs:
            return self._old_dirs[rel_dir]
        fd: int | None = None
        try:
            if not rel_dir:
                fd = os.open(self.final, DIR_READ)
            else:
                parent_rel, _, name = rel_dir.rpartition("/")
                parent = self._open_old_dir(parent_rel)
                if parent is not None:
                    fd = os.open(name, DIR_READ, dir_fd=parent)
        except OSError:
            fd = None
        self._old_dirs[rel_dir] = fd
        return fd

    def _carry_over(self, entry: Entry, dest: str) -> bool:
        """Hardlink the previous version's copy of ``entry`` at ``dest`` if it still is a
        plain file of the expected size and mode; False if not (then it is made anew)."""
        rel_dir, _, name = entry.path.rpartition("/")
        fd = self._old_dir(rel_dir)
        if fd is None:
            return False
        try:
            os.link(name, dest, src_dir_fd=fd, follow_symlinks=False)
        except OSError:
            return False
        st = os.lstat(dest)
        rewritten = entry.path == "config.json" and self.method != "copy"  # private copy
        if (not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != entry.mode
                or (st.st_size != entry.size and not rewritten)):
            os.unlink(dest)
            return False
        return True

    def build(self, entries: list[Entry]) -> None:
        """Make ``entries`` (parents before children) in the scratch tree."""
        timed = self.make_nodes(entries)
        self.place_files([entry for entry in entries if entry.type == "file"])
        self.set_times(timed)

    def make_nodes(self, entries: Sequence[Entry]) -> list[Entry]:
        """Create the directories (private until :meth:`set_times`), symlinks and fifos among
        ``entries``; returns those whose times and modes are set last."""
        scratch = self._scratch_text
        timed: list[Entry] = []  # directories and symlinks: their mtimes are set last
        for entry in entries:
            if entry.type == "dir":
                os.mkdir(f"{scratch}/{entry.path}", 0o700)
                timed.append(entry)
            elif entry.type == "symlink":
                assert entry.target is not None
                os.symlink(entry.target, f"{scratch}/{entry.path}")
                timed.append(entry)
            elif entry.type == "fifo":
                os.mkfifo(f"{scratch}/{entry.path}", entry.mode)
        return timed

    def set_times(self, timed: Sequence[Entry]) -> None:
        """Give the entries :meth:`make_nodes` returned their mtimes, and directories their
        modes: children before parents (a directory's mtime changes when one is added)."""
        scratch = self._scratch_text
        for entry in reversed(timed):
            dest = f"{scratch}/{entry.path}"
            os.utime(dest, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)
            if entry.type == "dir":
                os.chmod(dest, entry.mode)

    def place_files(self, files: list[Entry]) -> None:
        """Put the regular files ``files`` into the scratch tree (their directories exist),
        spread over threads or forked workers, and count what was done."""
        scratch = self._scratch_text
        groups: list[tuple[Entry, Entry]] = []
        singles: list[Entry] = files
        if self.method == "copy":
            firsts: dict[tuple[int, int], Entry] = {}
            singles = []
            for entry in files:
                key = (entry.dev, entry.ino)
                if key in firsts:
                    groups.append((entry, firsts[key]))  # hardlink group inside the source
                else:
                    firsts[key] = entry
                    singles.append(entry)
        # batches of equal work: a link weighs only its per-file cost, a copy its bytes; a
        # re-stage of the same method links most files (all hashes known): count them equally
        weight: Callable[[Entry], int] = (
            (lambda e: 0) if self.method == "hardlink"
            else (lambda e: 0 if e.hash is not None else e.size) if self.carry_over
            else (lambda e: e.size))
        processes = min(self.jobs, usable_cpus())
        if processes > 1 and len(singles) >= FORK_MIN_FILES:
            outcomes = map_parts(self.place_part, singles, processes, weight=weight)
        elif any(self._plan(e) in (None, ("ingest", "")) for e in singles):  # copies
            outcomes = map_batched(self._place, singles, self.jobs, weight=weight)
        else:  # links only: threads would only contend for the GIL
            outcomes = self.place_part(singles)
        self.count(singles, outcomes)
        for entry, first in groups:
            os.link(os.path.join(scratch, first.path), os.path.join(scratch, entry.path))
            self.counts.linked += 1

    def count(self, files: Sequence[Entry], outcomes: Sequence[Outcome]) -> None:
        """Add what :meth:`place_part` did for ``files`` to the counts, the replaced files
        and the hashes computed on the way."""
        for entry, (outcome, size, content_hash) in zip(files, outcomes, strict=True):
            if outcome == "unchanged":
                self.counts.unchanged += 1
                continue
            self.replaced.append(entry)
            if content_hash is not None:
                self.hashes[entry.path] = content_hash
            if outcome == "copied":
                self.counts.copied += 1
                self.counts.bytes_copied += size
            else:
                self.counts.linked += 1

    def with_hashes(self, entries: list[Entry]) -> list[Entry]:
        """``entries`` with the hashes computed while placing them (:attr:`hashes`)."""
        hashes = self.hashes
        if not hashes:
            return entries
        return [e if e.path not in hashes else e.with_hash(hashes[e.path]) for e in entries]

    def _plan(self, entry: Entry) -> tuple[str, str] | None:
        """How :meth:`place_part` places ``entry`` through directory descriptors: ("source",
        outcome) links the source file (``hardlink``), ("pool", "unchanged") the pool entry
        of an unchanged file, ("ingest", "") copies it into an empty pool while hashing it;
        None when :meth:`_place` must decide."""
        if entry.path == "config.json":  # may be written as a private copy
            return None
        if self.method == "hardlink":
            before = self.previous.get(entry.path)
            same = self.carry_over and before is not None and before.same_stat(entry)
            return "source", "unchanged" if same else "linked"
        if self.method == "pool" and entry.hash is None and not self.previous:
            return "ingest", ""
        if self.method == "pool" and self.carry_over and entry.hash is not None:
            before = self.previous.get(entry.path)
            if before is not None and before.same_content(entry):
                return "pool", "unchanged"
        return None

    def place_part(self, part: Sequence[Entry]) -> list[Outcome]:
        """:meth:`_place` for a slice of the files (in a forked worker, or here), with the
        common cases — one ``link()`` from the source or the pool, or a copy into an empty
        pool — done through descriptors of the file's directories: no per-file path walk,
        no per-file decisions beyond a dict lookup."""
        results: list[Outcome] = []
        current: str | None = None
        dest_fd = src_fd = -1
        try:
            for entry in part:
                plan = self._plan(entry)
                if plan is None:
                    results.append(self._place(entry))
                    continue
                how, outcome = plan
                rel_dir, _, name = entry.path.rpartition("/")
                if rel_dir != current:
                    for fd in (dest_fd, src_fd):
                        if fd >= 0:
                            os.close(fd)
                    dest_fd = src_fd = -1
                    # our own scratch tree: every directory in it was made by make_nodes()
                    dest_fd = os.open(rel_dir or ".", DIR_READ, dir_fd=self._scratch_fd)
                    current = rel_dir
                if how == "pool":
                    assert entry.hash is not None
                    key = pool_key(entry.hash, entry.mode)
                    if not self._pool_entry_ok(entry, key, rel_dir, name):
                        results.append(self._place(entry))  # verified, or a private copy
                        continue
                    try:
                        os.link(f"{key[:2]}/{key}", name, src_dir_fd=self._pool_fd,
                                dst_dir_fd=dest_fd, follow_symlinks=False)
                    except OSError as exc:  # released meanwhile, or refused: copy again
                        if not (isinstance(exc, FileNotFoundError) or link_refused(exc)):
                            raise
                        results.append(self._place(entry))
                        continue
                    results.append((outcome, 0, None))
                    continue
                if src_fd < 0:
                    src_fd = os.open(rel_dir or ".", DIR_FOLLOW, dir_fd=self._source_fd)
                if how == "source":
                    try:
                        os.link(name, name, src_dir_fd=src_fd, dst_dir_fd=dest_fd,
                                follow_symlinks=False)
                    except OSError as exc:
                        if not link_refused(exc):
                            raise
                        results.append(self._place(entry))  # copies where links fail
                        continue
                    results.append((outcome, 0, None))
                    continue
                content_hash, new = self.pool.ingest(
                    name, entry.mode, entry.mtime_ns, name, entry.size, source_dir=src_fd,
                    dest_dir=dest_fd, umask=self._umask)
                results.append(("copied", entry.size, content_hash) if new
                               else ("linked", 0, content_hash))
        finally:
            for fd in (dest_fd, src_fd):
                if fd >= 0:
                    os.close(fd)
        return results

    def _place(self, entry: Entry) -> Outcome:
        """Put one regular file into the scratch tree; returns (what happened, bytes copied,
        the content hash if it was computed here). Runs in forked workers: it changes no
        state of the builder but the copier's and the old-version descriptors' caches."""
        src = f"{self._source_text}/{entry.path}"
        dest = f"{self._scratch_text}/{entry.path}"
        before = self.previous.get(entry.path)
        # hardlink versions carry no content hashes: the source inode itself is staged
        same = self.carry_over and before is not None and (
            before.same_stat(entry) if self.method == "hardlink" else before.same_content(entry))
        if same and self.method == "copy" and self._carry_over(entry, dest):
            return "unchanged", 0, None
        if same and entry.path == "config.json" and self.method != "copy" \
                and self._carry_over(entry, dest):
            return "unchanged", 0, None
        if same and self.method == "hardlink":  # the previous version linked this very file
            return self._link_or_copy(src, dest, entry, "unchanged")
        if same and self.method == "pool":  # linked from the pool, as before
            assert entry.hash is not None
            self.pool.link_into(src, pool_key(entry.hash, entry.mode), entry.mode,
                                entry.mtime_ns, dest, self.copier)
            return "unchanged", 0, None
        if entry.path == "config.json":
            written = self._private_config(src, dest, entry, shared=self.method != "copy")
            if written is not None:
                return "copied", written, hash_file(src) if entry.hash is None else None
        if self.method == "hardlink":
            return self._link_or_copy(src, dest, entry, "linked")
        if self.method == "pool" and entry.hash is None:  # first stage: copy + hash at once
            content_hash, new = self.pool.ingest(src, entry.mode, entry.mtime_ns, dest,
                                                 entry.size, umask=self._umask)
            return ("copied", entry.size, content_hash) if new else ("linked", 0, content_hash)
        if self.method == "pool":
            assert entry.hash is not None
            if self.pool.link_into(src, pool_key(entry.hash, entry.mode), entry.mode,
                                   entry.mtime_ns, dest, self.copier):
                return "copied", entry.size, None
            return "linked", 0, None
        self.copier.copy_new(src, dest, entry.mode, entry.mtime_ns)
        return "copied", entry.size, None

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
        old = self._old_dir(rel_dir)
        try:
            if old is not None and identity(os.stat(name, dir_fd=old, follow_symlinks=False)) \
                    == identity(st):
                return True
        except OSError:
            pass
        return self.pool.entry_problem(pooled, key, entry.size, dir_fd=self._pool_fd,
                                       st=st) is None

    def _link_or_copy(self, src: str, dest: str, entry: Entry, outcome: str) -> Outcome:
        """Hard-link ``src`` at ``dest``, or copy it where the link is refused (a mount point
        inside the source, EXDEV; a file at its link limit)."""
        try:
            os.link(src, dest, follow_symlinks=False)
        except OSError as exc:
            if not link_refused(exc):
                raise
            self.copier.copy_new(src, dest, entry.mode, entry.mtime_ns)
            return "copied", entry.size, None
        return outcome, 0, None

    def _private_config(self, src: str, dest: str, entry: Entry, shared: bool) -> int | None:
        """Write config.json as a file of its own: with a read-only root when the staged files
        are shared, writable again in a private copy of a bundle that was read-only only for
        sharing; its size, or None when the source's config.json can be staged as it is."""
        if entry.size > 16 << 20:
            return None
        with open(src, "rb") as file:
            data = readonly_config(file.read()) if shared else writable_config(file.read())
        if data is None:
            return None
        write_private(Path(dest), data)
        os.chmod(dest, entry.mode)
        return len(data)
