"""A per-target pool of file contents, so equal files are stored once per target filesystem.

``TARGET/.ocistage-pool/<hh>/<xxh3-128>-<mode>`` (``.ocistage-pool-<uid>`` in a shared
target: one pool per user, :func:`ocistage.cache.targetlayout.pool_name`) holds one read-only copy
of each distinct (content, permission bits) pair that any bundle staged into ``TARGET`` uses;
bundles hardlink to it. Staging a new version of an image, or a second image sharing files
with a staged one, copies only contents the pool lacks. Permission bits and extended
attributes (a digest of them, :mod:`ocistage.stagers.xattrs`) are part of the key because
hardlinks share them; mtimes are not (a pooled file keeps the mtime of its first copy).

A pool file is published by ``link()`` of a private temp file, which fails if another process
published the same key first (then both use that one). An entry whose link count is 1 is used by
no bundle; :func:`release` removes such entries for the keys an unstaged bundle used. A stager
racing with that removal sees ``ENOENT`` from ``link()`` and copies again (:func:`link_into`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ocistage.cache.dirfds import identity
from ocistage.cache.fdio import created_exactly, write_all
from ocistage.cache.linkprobes import link_refused
from ocistage.cache.privatedirs import make_private
from ocistage.cache.targetlayout import POOL_TEMP_SUFFIX, pool_name, shared_target
from ocistage.stagers import xattrs
from ocistage.stagers.copy import Copier, link_fd
from ocistage.stagers.filemanifest import CHUNK
from ocistage.stagers.target import own_dir


def pool_key(content_hash: str, mode: int, xattrs: str | None = None) -> str:
    """The pool entry of a file of this content, mode and xattr digest
    (:func:`ocistage.stagers.xattrs.digest`; a file without xattrs has the key it had before
    they were copied): ``<hash>-<mode>[-<xattrs>]``."""
    key = f"{content_hash}-{mode:04o}"
    return f"{key}-{xattrs}" if xattrs else key


def split_key(key: str) -> tuple[str, str, str]:
    """(content hash, mode in octal, xattr digest or "") of a :func:`pool_key`."""
    content_hash, _, rest = key.partition("-")
    mode, _, xattrs = rest.partition("-")
    return content_hash, mode, xattrs


@dataclass(frozen=True)
class Pool:
    root: Path

    @classmethod
    def of_target(cls, target: Path) -> Pool:
        """The caller's pool in ``target`` (:func:`ocistage.cache.targetlayout.pool_name`: one of
        their own in a shared, sticky target)."""
        try:
            shared = shared_target(os.stat(target))
        except FileNotFoundError:
            shared = False
        return cls(target / pool_name(shared))

    def path(self, key: str) -> Path:
        return self.root / key[:2] / key

    def prepare(self) -> None:
        """Create the pool and its 256 fan-out directories once, instead of checking per
        file; the pool must be trusted (docs/trust.md: the caller's or root's, not writable
        by others), or another user could have planted its entries. It is owner-only
        (:data:`ocistage.cache.privatedirs.PRIVATE_DIR_MODE`; one made before is made so): its
        entries are the staged images' files, setuid ones and those with file capabilities
        among them, which no other user may reach."""
        self.root.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.close(own_dir(self.root.parent, self.root.name, "pool"))
        make_private(self.root)
        # one listing instead of 256 mkdir calls failing with EEXIST (and the stat of each
        # that makedirs adds) at every re-stage: on a parallel filesystem each is a round trip
        with os.scandir(self.root) as listing:
            present = {entry.name for entry in listing if entry.is_dir(follow_symlinks=False)}
        for n in range(256):
            if f"{n:02x}" not in present:
                os.makedirs(os.path.join(self.root, f"{n:02x}"), exist_ok=True)

    def entry_problem(self, name: str, key: str, size: int | None = None, *,
                      dir_fd: int | None = None, content: bool = True,
                      st: os.stat_result | None = None) -> str | None:
        """Why the pool entry ``name`` (relative to ``dir_fd``) may not be linked into a
        bundle as ``key``, or None: it must be a regular file of the caller with the key's
        mode (and ``size``) and, with ``content``, hold the key's xxh3-128. "missing" when
        there is none. ``st``: the entry's ``lstat`` when the caller has just taken it (the
        content read is then checked to be of that very inode)."""
        if st is None:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                return "missing"
        content_hash, mode, xattr_digest = split_key(key)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_uid != os.geteuid():
            return f"owned by uid {st.st_uid}"
        if f"{stat.S_IMODE(st.st_mode):04o}" != mode:
            return f"mode {stat.S_IMODE(st.st_mode):04o}, not {mode}"
        if size is not None and size >= 0 and st.st_size != size:
            return f"{st.st_size} bytes, not {size}"
        if content:
            return _content_problem(name, dir_fd, st, content_hash, xattr_digest)
        return None

    def link_into(self, source: str, key: str, mode: int, mtime_ns: int, dest: str,
                  copier: Copier) -> bool:
        """Hardlink pool entry ``key`` at ``dest``, first copying ``source`` into the pool if
        the entry is missing (with its xattrs if the key has them). Returns True when bytes
        were copied."""
        with_xattrs = bool(split_key(key)[2])
        pooled = f"{os.fspath(self.root)}/{key[:2]}/{key}"
        copied = False
        try:
            for _attempt in range(5):
                # an entry this call just added needs no hashing: it is a copy of source
                problem = self.entry_problem(pooled, key, content=not copied)
                if problem is not None and problem != "missing":
                    break  # not to be trusted: dest becomes a private copy
                try:
                    os.link(pooled, dest, follow_symlinks=False)
                    return copied
                except FileNotFoundError:
                    if not os.path.isdir(os.path.dirname(dest)):
                        raise
                self._add(source, pooled, mode, mtime_ns, copier, with_xattrs)
                copied = True
        except OSError as exc:
            if not link_refused(exc):  # the pool is on another mount: a private copy
                raise
        copier.copy_new(source, dest, mode, mtime_ns, with_xattrs)
        return True

    def _add(self, source: str, pooled: str, mode: int, mtime_ns: int, copier: Copier,
             with_xattrs: bool) -> None:
        """Publish a copy of ``source`` as ``pooled``; a no-op if someone else did first.

        The copy is an ``O_TMPFILE`` (nameless until linked: a crash leaves nothing behind)
        where the filesystem supports it, else a temp name that is renamed.
        """
        try:
            fd = os.open(os.path.dirname(pooled), os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC,
                         0o600)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
                raise
            os.makedirs(os.path.dirname(pooled), exist_ok=True)
            self._add_named(source, pooled, mode, mtime_ns, copier, with_xattrs)
            return
        try:
            copier.copy_into(source, fd, with_xattrs)
            os.fchmod(fd, mode)
            os.utime(fd, ns=(mtime_ns, mtime_ns))
            with contextlib.suppress(FileExistsError):
                link_fd(fd, pooled)
        finally:
            os.close(fd)

    def _add_named(self, source: str, pooled: str, mode: int, mtime_ns: int,
                   copier: Copier, with_xattrs: bool) -> None:
        temp = f"{pooled}.{os.getpid()}-{uuid.uuid4().hex[:8]}{POOL_TEMP_SUFFIX}"
        try:
            copier.copy_new(source, temp, mode, mtime_ns, with_xattrs)
            with contextlib.suppress(FileExistsError):
                os.link(temp, pooled)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)

    def is_empty(self) -> bool:
        """True when no content is pooled yet (the first stage into this target)."""
        try:
            with os.scandir(self.root) as fanout:
                for directory in fanout:
                    with os.scandir(directory.path) as entries:
                        if any(not e.name.startswith(".") for e in entries):
                            return False
        except (FileNotFoundError, NotADirectoryError):
            return True
        return True

    def ingest(self, source: str, mode: int, mtime_ns: int, dest: str, size: int = -1, *,
               source_dir: int | None = None, dest_dir: int | None = None,
               umask: int | None = None, xattr_digest: str | None = None,
               copier: Copier | None = None) -> tuple[str, bool]:
        """Copy ``source`` to ``dest`` while hashing it, one pass, and publish it in the pool.

        For a first stage into an empty pool: hashing first and copying after would read
        everything twice. ``dest`` (in the caller's private scratch dir, must not exist) is
        written and closed, then linked into the pool under its hash: a pool entry is never
        visible half written, and no temp name or ``O_TMPFILE`` is needed (so it works on NFS
        too). If the pool has the content already, ``dest`` becomes a link of that entry.
        ``size`` (from the scan) lets a small file be read in one call. ``source`` and
        ``dest`` are relative to the directory descriptors ``source_dir`` and ``dest_dir``
        when given (no path walk per file). ``umask``, the process's
        (:func:`ocistage.cache.fdio.process_umask`),
        lets ``dest`` be created with its final mode instead of being chmod'ed after
        (:func:`ocistage.cache.fdio.created_exactly`). ``xattr_digest``: the source's
        (:func:`ocistage.stagers.xattrs.digest`); when not empty, the xattrs are copied too
        (refusals counted by ``copier``) and the key has it.
        Returns (xxh3-128 hex, whether the content was new to the pool).
        """
        hasher = xxhash.xxh3_128()
        src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=source_dir)
        try:
            # created with its final mode when the umask keeps it (a write by a non-root
            # owner would clear set-id bits: those are always set after writing)
            exact = created_exactly(mode, umask)
            out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, mode if exact else 0o600, dir_fd=dest_dir)
            try:
                # asking for size+1 bytes reads a small file whole and sees its end at once
                want = size + 1 if 0 <= size < CHUNK else CHUNK
                total = 0
                while chunk := os.read(src, want):
                    hasher.update(chunk)
                    write_all(out, chunk)
                    total += len(chunk)
                    if total == size and len(chunk) < want:
                        break  # the scanned size, and a short read: at the end
                    want = CHUNK
                if not exact:
                    os.fchmod(out, mode)
                if xattr_digest:
                    (copier or Copier()).copy_xattrs(src, out)
                os.utime(out, ns=(mtime_ns, mtime_ns))
            finally:
                os.close(out)
        finally:
            os.close(src)
        content_hash = hasher.hexdigest()
        return content_hash, self._publish(dest, dest_dir, pool_key(content_hash, mode,
                                                                    xattr_digest), total)

    def _publish(self, dest: str, dest_dir: int | None, key: str, size: int) -> bool:
        """Link the file ``dest`` (of ``size`` bytes) into the pool as ``key``, or make it a
        link of the entry there already; returns whether it is new to the pool (or stays a
        private copy)."""
        pooled = f"{os.fspath(self.root)}/{key[:2]}/{key}"
        for _attempt in range(5):
            try:
                os.link(dest, pooled, src_dir_fd=dest_dir, follow_symlinks=False)
                return True
            except FileExistsError:
                pass
            except OSError as exc:
                if link_refused(exc):  # the pool is on another mount: dest stays private
                    return True
                raise
            if self.entry_problem(pooled, key, size) is not None:
                return True  # a pooled entry not to be trusted: dest stays
            twin = f"{dest}.ocistage-twin"
            try:
                os.link(pooled, twin, dst_dir_fd=dest_dir, follow_symlinks=False)
            except FileNotFoundError:  # released by a concurrent unstage: publish ours
                continue
            except OSError as exc:  # EEXIST is checked before EXDEV: another mount
                if link_refused(exc):
                    return True
                raise
            os.rename(twin, dest, src_dir_fd=dest_dir, dst_dir_fd=dest_dir)  # share the inode
            return False
        return True  # the pool keeps losing it: dest stays a private copy

    def release(self, keys: set[str]) -> int:
        """Remove the entries among ``keys`` that no bundle links to any more; returns how many."""
        removed = 0
        for key in keys:
            pooled = self.path(key)
            try:
                if os.lstat(pooled).st_nlink == 1:
                    os.unlink(pooled)
                    removed += 1
            except FileNotFoundError:
                continue
        return removed


def _content_problem(name: str, dir_fd: int | None, st: os.stat_result, content_hash: str,
                     xattr_digest: str) -> str | None:
    """:meth:`Pool.entry_problem`'s read of the entry ``name`` (whose ``lstat`` is ``st``):
    why its content (and xattrs, if the key has them) are not the key's, or None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        return "missing"
    try:
        if identity(os.fstat(fd)) != identity(st):
            return "replaced while it was checked"
        hasher = xxhash.xxh3_128()
        while chunk := os.read(fd, CHUNK):
            hasher.update(chunk)
        if xattr_digest and xattrs.digest(fd) != xattr_digest:
            return "xattrs do not match its key"
    finally:
        os.close(fd)
    if hasher.hexdigest() != content_hash:
        return "content does not match its key"
    return None
