"""Apply one layer (an uncompressed tar stream) onto a rootfs, as image-spec ``layer.md`` says.

The tar is read once, in streaming mode; every entry is written by this module through
:class:`ocistage.bundler.unpack.safepath.SafeRoot` (never ``tarfile.extract``), so nothing
outside the rootfs is ever created, written, linked, chmod-ed, utime-d, xattr-ed or deleted.
The tar format itself is read by :mod:`ocistage.bundler.unpack.tarstream`. See
``docs/layers.md`` for the semantics and the deliberate differences from
``umoci unpack --rootless``.

Whiteouts apply to lower layers only, whatever their order in the tar: every path this layer
creates is remembered, and a whiteout (``.wh.NAME``) or opaque marker (``.wh..wh..opq``) removes
only what this layer did not create, keeping directories that lead to entries it created.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, cast

from ocistage.bundler.unpack.safepath import Parts, SafeRoot, display, normalize, open_readable_dir
from ocistage.bundler.unpack.tarstream import (
    COPY_CHUNK,
    PLAIN_FILE_TYPES,
    ForwardReader,
    member_data,
    member_xattrs,
    members,
    mtime_ns,
    small_member_data,
    tarinfo_class,
)
from ocistage.cache.dirfds import DIR_READ, chmod_path_fd, chown_path_fd
from ocistage.cache.fdio import created_exactly, process_umask, write_all
from ocistage.cache.notice import Kind, Notice
from ocistage.cache.treeremoval import remove_at
from ocistage.cache.unpackbudget import ENTRY_CHARGE, UnpackBudget
from ocistage.errors import LayerError, OcistageError

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_XATTR_SKIPPABLE = {errno.EPERM, errno.EACCES, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EINVAL,
                    errno.ERANGE, errno.E2BIG}
_CORRUPT_HINT = ("the layer blob is corrupt or not a tar archive; remove it from the cache "
                 "and pull again")


@dataclass
class ApplyReport:
    """What applying one layer did."""

    entries: int = 0
    bytes_written: int = 0
    warnings: list[Notice] = field(default_factory=list)
    unreadable: int = 0   # files made that their owner may not read (no u+r)
    links: int = 0        # hard links made


def apply_layer(stream: BinaryIO, rootfs: Path, *, rootless: bool = True,
                budget: UnpackBudget | None = None) -> ApplyReport:
    """Apply the uncompressed tar ``stream`` onto the existing directory ``rootfs``, in place.

    ``rootless``: no ``chown``, device nodes become empty regular files (with a warning), and
    directories keep ``u+rwx`` so the bundle can always be deleted. Otherwise (running as
    root) owners are set and device nodes created as in the image. Sparse files keep their
    holes. ``budget``: file data written counts against it (LayerError when exceeded).
    """
    report = ApplyReport()
    try:
        with SafeRoot(rootfs) as root:
            applier = _Applier(root, rootless, report, budget)
            # "r:" over a forward-only reader: the same parsing as "r|" without its _Stream,
            # which copies its whole buffer on every header read (measured: see
            # docs/performance.md)
            with tarfile.open(fileobj=ForwardReader(stream), mode="r:",  # type: ignore[call-overload]
                              tarinfo=tarinfo_class()) as archive:
                for member in members(archive):
                    applier.apply(archive, member)
            applier.finish()
    except tarfile.TarError as exc:
        raise LayerError(f"cannot read layer tar: {exc}", _CORRUPT_HINT) from exc
    except OcistageError:
        raise
    except OSError as exc:
        hint = ("free some space on the filesystem of the bundle"
                if exc.errno in (errno.ENOSPC, errno.EDQUOT) else
                "check the permissions and free space of the destination directory")
        raise LayerError(f"cannot apply layer onto {rootfs}: {exc.strerror or exc}", hint) from exc
    return report


@dataclass
class _DirMeta:
    mode: int
    mtime_ns: int
    uid: int
    gid: int


class _Applier:
    """The state of one layer being applied (paths it created, directory metadata to set)."""

    def __init__(self, root: SafeRoot, rootless: bool, report: ApplyReport,
                 budget: UnpackBudget | None = None) -> None:
        self.root = root
        self.rootless = rootless
        self.report = report
        self.budget = budget
        # "a/b/c" of every path this layer made: one str per entry (~100 bytes; a tuple of its
        # components took ~320, 100 MB for a layer of 300k entries)
        self.created: set[str] = set()
        self.created_ancestors: set[Parts] = set()
        self.dirs: dict[Parts, _DirMeta] = {}
        self.saved_mtimes: dict[Parts, tuple[int, int]] = {}
        # directories whose times are saved or that this layer made: nothing more to save
        # (a directory made by this layer stays in ``created``, a saved time stays saved)
        self.settled: set[Parts] = set()
        self.umask = process_umask()
        self.exact_modes: dict[int, bool] = {}  # mode -> created with it (rootless, umask)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _mark_created(self, path: Parts) -> None:
        self.created.add("/".join(path))
        if path[:-1] in self.created_ancestors:
            return  # the parent is recorded, and so are its ancestors (most entries)
        for depth in range(len(path) - 1, -1, -1):
            ancestor = path[:depth]
            if ancestor in self.created_ancestors:
                break
            self.created_ancestors.add(ancestor)

    def _implicit_dir(self, path: Parts) -> None:
        """A missing parent was created: earlier records for this path are stale."""
        self._mark_created(path)
        self.dirs.pop(path, None)
        self.saved_mtimes.pop(path, None)

    def _save_mtime(self, parent: Parts, parent_fd: int) -> None:
        """Remember a lower directory's times before this layer changes its entries."""
        if parent in self.settled:
            return
        self.settled.add(parent)
        if parent in self.saved_mtimes or "/".join(parent) in self.created:
            return
        info = os.stat(parent_fd)
        self.saved_mtimes[parent] = (info.st_atime_ns, info.st_mtime_ns)

    def _warn(self, kind: Kind, message: str) -> None:
        self.report.warnings.append(Notice(kind, message))

    def _parent(self, parts: Parts) -> tuple[int, Parts]:
        found = self.root.resolve_dir(parts[:-1], create=True, on_create=self._implicit_dir)
        assert found is not None  # create=True either returns or raises
        return found

    def _clear(self, parent_fd: int, name: str) -> None:
        """Remove whatever is at ``name`` so that another type can take its place."""
        try:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        remove_at(parent_fd, name, own_tree=True)
        if stat.S_ISDIR(info.st_mode) or stat.S_ISLNK(info.st_mode):
            self.root.invalidate()

    # -- entries -------------------------------------------------------------------------------

    def apply(self, archive: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        self.report.entries += 1
        if self.budget is not None:
            self.budget.charge(ENTRY_CHARGE)
        parts = normalize(member.name)
        if not parts:
            if member.isdir():
                self.dirs[()] = self._dir_meta(member)
            else:
                self._warn(Kind.SKIPPED,
                           f"skipped non-directory entry {member.name!r} for the root")
            return
        base = parts[-1]
        if base.startswith(WHITEOUT_PREFIX):
            self._whiteout(parts)
            return
        parent_fd, parent = self._parent(parts)
        path = (*parent, base)
        self._save_mtime(parent, parent_fd)
        if member.type in PLAIN_FILE_TYPES:  # isreg() but for sparse: the most common, first
            self._make_file(archive, parent_fd, base, path, member)
        elif member.isdir():
            self._make_dir(parent_fd, base, path, member)
        elif member.isreg():
            self._make_file(archive, parent_fd, base, path, member)
        elif member.issym():
            self._make_symlink(parent_fd, base, member)
        elif member.islnk():
            self._make_hardlink(parent_fd, base, path, member)
        elif member.isfifo() or member.ischr() or member.isblk():
            self._make_special(parent_fd, base, path, member)
        else:
            self._warn(Kind.SKIPPED,
                       f"skipped {display(path)}: unsupported tar entry type {member.type!r}")
            return
        self._mark_created(path)

    def _dir_meta(self, member: tarfile.TarInfo) -> _DirMeta:
        return _DirMeta(stat.S_IMODE(member.mode), mtime_ns(member), member.uid, member.gid)

    def _make_dir(self, parent_fd: int, name: str, path: Parts, member: tarfile.TarInfo) -> None:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                self._clear(parent_fd, name)
                os.mkdir(name, 0o700, dir_fd=parent_fd)
        self.dirs[path] = self._dir_meta(member)
        xattrs = member_xattrs(member)
        if xattrs:
            fd = os.open(name, DIR_READ, dir_fd=parent_fd)
            try:
                self._set_xattrs(fd, path, xattrs)
            finally:
                os.close(fd)

    def _create_file(self, parent_fd: int, name: str, mode: int = 0o600) -> int:
        try:
            return os.open(name, _CREATE_FLAGS, mode, dir_fd=parent_fd)
        except FileExistsError:
            self._clear(parent_fd, name)
            return os.open(name, _CREATE_FLAGS, mode, dir_fd=parent_fd)

    def _make_file(self, archive: tarfile.TarFile, parent_fd: int, name: str, path: Parts,
                   member: tarfile.TarInfo) -> None:
        mode = member.mode & 0o7777
        # rootless, with no chown to come: created with its mode where the umask keeps it
        exact = self.exact_modes.get(mode)
        if exact is None:
            exact = self.exact_modes[mode] = (self.rootless
                                              and created_exactly(mode, self.umask))
        fd = self._create_file(parent_fd, name, mode if exact else 0o600)
        try:
            if member.sparse is not None:
                self._write_sparse(archive, fd, path, member)
            elif member.size:
                self._write_data(archive, fd, member)
            self._finish_inode(fd, member, path, mode_set=exact)
        finally:
            os.close(fd)

    def _write_data(self, archive: tarfile.TarFile, fd: int, member: tarfile.TarInfo) -> None:
        block = small_member_data(archive, member)
        for chunk in (block,) if block is not None else member_data(archive, member):
            if self.budget is not None:
                self.budget.charge(len(chunk))
            write_all(fd, chunk)
            self.report.bytes_written += len(chunk)

    def _write_sparse(self, archive: tarfile.TarFile, fd: int, path: Parts,
                      member: tarfile.TarInfo) -> None:
        """A sparse member (GNU old, GNU PAX 0.0/0.1/1.0): its data blocks written at their
        offsets, the holes left as holes (seek, then ``ftruncate`` to the real size)."""
        stream = archive.fileobj
        assert stream is not None and member.sparse is not None
        stream.seek(member.offset_data)
        blocks = cast("list[tuple[int, int]]", member.sparse)  # typeshed says list[int]
        for offset, numbytes in blocks:
            if offset < 0 or numbytes < 0 or offset + numbytes > member.size:
                raise LayerError(f"sparse file {display(path)} has a block at {offset}+"
                                 f"{numbytes}, past its size {member.size}", _CORRUPT_HINT)
            remaining = numbytes
            while remaining:
                chunk = stream.read(min(remaining, COPY_CHUNK))
                if not chunk:
                    raise tarfile.ReadError("unexpected end of data")
                if self.budget is not None:
                    self.budget.charge(len(chunk))
                _pwrite_all(fd, chunk, offset + numbytes - remaining)
                remaining -= len(chunk)
                self.report.bytes_written += len(chunk)
        os.ftruncate(fd, member.size)

    def _finish_inode(self, fd: int, member: tarfile.TarInfo, path: Parts,
                      mode_set: bool = False) -> None:
        """Owner, mode (unless ``mode_set`` at creation), xattrs and times of a file opened
        for writing (the mode after the data and the owner: both clear setuid bits)."""
        if not self.rootless:
            os.fchown(fd, member.uid, member.gid)
        if not mode_set:
            os.fchmod(fd, stat.S_IMODE(member.mode))
        if not member.mode & stat.S_IRUSR:
            self.report.unreadable += 1
        if member.pax_headers:
            xattrs = member_xattrs(member)
            if xattrs:
                self._set_xattrs(fd, path, xattrs)
        mtime = mtime_ns(member)
        os.utime(fd, ns=(mtime, mtime))

    def _make_symlink(self, parent_fd: int, name: str, member: tarfile.TarInfo) -> None:
        try:
            os.symlink(member.linkname, name, dir_fd=parent_fd)
        except FileExistsError:
            self._clear(parent_fd, name)
            os.symlink(member.linkname, name, dir_fd=parent_fd)
        if not self.rootless:
            os.chown(name, member.uid, member.gid, dir_fd=parent_fd, follow_symlinks=False)
        if member_xattrs(member):
            self._warn(Kind.XATTR, f"skipped xattrs of symlink {member.name!r}")
        mtime = mtime_ns(member)
        os.utime(name, ns=(mtime, mtime), dir_fd=parent_fd, follow_symlinks=False)

    def _make_hardlink(self, parent_fd: int, name: str, path: Parts,
                       member: tarfile.TarInfo) -> None:
        target = normalize(member.linkname)
        missing = LayerError(
            f"hardlink {display(path)} points to {member.linkname!r}, which does not exist",
            "a hardlink must name a file of this layer or of a lower one; the image is broken")
        if not target:
            raise missing
        parent_fd = os.dup(parent_fd)
        try:
            found = self.root.resolve_dir(target[:-1])
            if found is None:
                raise missing
            source_fd, source_parent = found
            source = (*source_parent, target[-1])
            try:
                info = os.stat(target[-1], dir_fd=source_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise missing from None
            if stat.S_ISDIR(info.st_mode):
                raise LayerError(f"hardlink {display(path)} points to directory "
                                 f"{display(source)}", "hardlinks to directories are invalid")
            if source == path:
                return
            if source[:len(path)] == path:
                raise LayerError(f"hardlink {display(path)} would replace the directory holding "
                                 f"its own target {display(source)}", "the image is broken")
            source_fd = os.dup(source_fd)
            try:
                try:
                    os.link(target[-1], name, src_dir_fd=source_fd, dst_dir_fd=parent_fd,
                            follow_symlinks=False)
                except FileExistsError:
                    self._clear(parent_fd, name)
                    try:
                        os.link(target[-1], name, src_dir_fd=source_fd, dst_dir_fd=parent_fd,
                                follow_symlinks=False)
                    except FileNotFoundError:
                        raise missing from None
                self.report.links += 1
            finally:
                os.close(source_fd)
        finally:
            os.close(parent_fd)

    def _make_special(self, parent_fd: int, name: str, path: Parts,
                      member: tarfile.TarInfo) -> None:
        mode = stat.S_IMODE(member.mode)
        device_node = member.ischr() or member.isblk()
        if device_node and self.rootless:
            kind = "character" if member.ischr() else "block"
            self._warn(Kind.DEVICE_NODE,
                       f"{display(path)}: {kind} device {member.devmajor}:{member.devminor} "
                       f"replaced by an empty file (rootless)")
            fd = self._create_file(parent_fd, name)
            try:
                self._finish_inode(fd, member, path)
            finally:
                os.close(fd)
            return
        if member.isfifo():
            kind_bits = stat.S_IFIFO
            device = 0
        else:
            kind_bits = stat.S_IFCHR if member.ischr() else stat.S_IFBLK
            device = os.makedev(member.devmajor, member.devminor)
        try:
            os.mknod(name, 0o600 | kind_bits, device, dir_fd=parent_fd)
        except FileExistsError:
            self._clear(parent_fd, name)
            os.mknod(name, 0o600 | kind_bits, device, dir_fd=parent_fd)
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        try:
            if stat.S_ISLNK(os.fstat(fd).st_mode):  # pragma: no cover - we just made it
                raise LayerError(f"{display(path)} changed while being created")
            if not self.rootless:
                chown_path_fd(fd, member.uid, member.gid)
            chmod_path_fd(fd, mode)
        finally:
            os.close(fd)
        if member_xattrs(member):
            self._warn(Kind.XATTR, f"skipped xattrs of special file {display(path)}")
        mtime = mtime_ns(member)
        os.utime(name, ns=(mtime, mtime), dir_fd=parent_fd, follow_symlinks=False)

    def _set_xattrs(self, fd: int, path: Parts, xattrs: dict[str, bytes]) -> None:
        for key, value in xattrs.items():
            try:
                os.setxattr(fd, key, value)
            except OSError as exc:
                if exc.errno not in _XATTR_SKIPPABLE:
                    raise
                self._warn(Kind.XATTR, f"{display(path)}: xattr {key} not set ({exc.strerror})")

    # -- whiteouts -----------------------------------------------------------------------------

    def _whiteout(self, parts: Parts) -> None:
        base = parts[-1]
        if base != OPAQUE_MARKER and base.startswith(OPAQUE_MARKER[:8]):
            self._warn(Kind.SKIPPED, f"skipped AUFS metadata entry {display(parts)}")
            return
        if base != OPAQUE_MARKER:
            victim = base[len(WHITEOUT_PREFIX):]
            if victim in ("", ".", ".."):
                raise LayerError(f"invalid whiteout entry {display(parts)}",
                                 "a whiteout must name a file: .wh.NAME; the image is broken")
        found = self.root.resolve_dir(parts[:-1])
        if found is None:
            return
        parent_fd, parent = found
        parent_fd = os.dup(parent_fd)
        try:
            if base == OPAQUE_MARKER:
                for child in _list_dir(parent_fd):
                    self._remove_lower(parent_fd, parent, child)
            else:
                self._remove_lower(parent_fd, parent, victim)
        finally:
            os.close(parent_fd)

    def _remove_lower(self, parent_fd: int, parent: Parts, name: str) -> None:
        """Remove what lower layers put at ``parent/name``, keeping what this layer made."""
        path = (*parent, name)
        try:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if "/".join(path) in self.created or path in self.created_ancestors:
            if stat.S_ISDIR(info.st_mode):
                fd = os.open(name, DIR_READ, dir_fd=parent_fd)
                try:
                    for child in _list_dir(fd):
                        self._remove_lower(fd, path, child)
                finally:
                    os.close(fd)
            return
        self._save_mtime(parent, parent_fd)
        remove_at(parent_fd, name, own_tree=True)
        if stat.S_ISDIR(info.st_mode) or stat.S_ISLNK(info.st_mode):
            self.root.invalidate()

    # -- the end -------------------------------------------------------------------------------

    def finish(self) -> None:
        """Set directory modes and times (deepest first), restore touched lower directories."""
        for path in sorted(self.dirs, key=len, reverse=True):
            meta = self.dirs[path]
            fd = self._open_dir_nofollow(path)
            if fd is None:
                continue
            try:
                if not self.rootless:
                    os.fchown(fd, meta.uid, meta.gid)
                os.fchmod(fd, meta.mode | 0o700 if self.rootless else meta.mode)
                os.utime(fd, ns=(meta.mtime_ns, meta.mtime_ns))
            finally:
                os.close(fd)
        for path, (atime, mtime) in self.saved_mtimes.items():
            if path in self.dirs:
                continue
            fd = self._open_dir_nofollow(path)
            if fd is None:
                continue
            try:
                os.utime(fd, ns=(atime, mtime))
            finally:
                os.close(fd)

    def _open_dir_nofollow(self, path: Parts) -> int | None:
        found = self.root.resolve_dir(path, follow=False)
        if found is None:
            return None
        return open_readable_dir(found[0])


def _list_dir(dir_fd: int) -> list[str]:
    fd = open_readable_dir(dir_fd)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
