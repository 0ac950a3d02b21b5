"""Moving one file's bytes: hardlink, reflink (FICLONE), ``copy_file_range``, ``sendfile``.

:class:`Copier` tries the cheapest way that gives an independent file: a reflink shares
extents copy-on-write (btrfs, XFS, bcachefs), ``copy_file_range`` lets the kernel (or an NFS
server) copy without the bytes passing through user space, ``sendfile`` does the same across
filesystems, and a plain read/write loop is the last resort. Each step falls back on the errors
that mean "not supported here", never on others. Nothing is ever read whole into memory.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ocistage.cache.fdio import UNSUPPORTED, reflink, write_all
from ocistage.cache.sharedcount import SharedCount
from ocistage.stagers import xattrs as xattrs_module

CHUNK = 1 << 30  # per copy_file_range/sendfile call; the kernel caps it anyway


def _kernel_copy(call: Callable[[int, int, int], int], src_fd: int, dst_fd: int,
                 size: int) -> int | None:
    """Copy ``size`` bytes with ``copy_file_range``/``sendfile``; None if unsupported here."""
    copied = 0
    while copied < size:
        try:
            n = call(src_fd, dst_fd, min(CHUNK, size - copied))
        except OSError as exc:
            if copied == 0 and exc.errno in UNSUPPORTED:
                return None
            raise
        if n == 0:
            break
        copied += n
    return copied


def _copy_file_range(src_fd: int, dst_fd: int, count: int) -> int:
    return os.copy_file_range(src_fd, dst_fd, count)


def _sendfile(src_fd: int, dst_fd: int, count: int) -> int:
    return os.sendfile(dst_fd, src_fd, None, count)


def _read_write(src_fd: int, dst_fd: int) -> None:
    while chunk := os.read(src_fd, 1 << 20):
        write_all(dst_fd, chunk)


@dataclass
class Copier:
    """Copies files between two filesystems, remembering which ways do not work there.

    One copier serves one (source, target) pair of filesystems; after the first "not supported"
    answer a way is not tried again, which saves two failing syscalls per file.
    ``xattrs_refused`` counts the extended attributes the target refused
    (:func:`ocistage.stagers.xattrs.copy`), in shared memory
    (:class:`~ocistage.cache.sharedcount.SharedCount`): forked workers add to it too.
    """

    reflink: bool = True
    copy_file_range: bool = True
    sendfile: bool = True
    xattrs_refused: SharedCount = field(default_factory=SharedCount)

    def copy_xattrs(self, src_fd: int, dst_fd: int) -> None:
        """Copy the xattrs of ``src_fd`` to ``dst_fd``, counting those refused."""
        refused = xattrs_module.copy(src_fd, dst_fd)
        if refused:
            self.xattrs_refused.add(refused)

    def copy_fd(self, src_fd: int, dst_fd: int, size: int) -> str:
        """Copy an open file into an empty one; returns the method that did it."""
        if self.reflink:
            if reflink(src_fd, dst_fd):
                return "reflink"
            self.reflink = False
        for flag, call, method in (("copy_file_range", _copy_file_range, "copy_file_range"),
                                   ("sendfile", _sendfile, "sendfile")):
            if size > 0 and getattr(self, flag):
                copied = _kernel_copy(call, src_fd, dst_fd, size)
                if copied is None:
                    setattr(self, flag, False)
                    continue
                if copied < size:  # the source shrank or grew meanwhile: finish by hand
                    _read_write(src_fd, dst_fd)
                return method
        _read_write(src_fd, dst_fd)
        return "read-write"

    def copy_into(self, src: str, dst_fd: int, xattrs: bool = False) -> str:
        """Copy the file ``src`` into the empty ``dst_fd``, with its extended attributes if
        ``xattrs``."""
        src_fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            method = self.copy_fd(src_fd, dst_fd, os.fstat(src_fd).st_size)
            if xattrs:  # after the content: a write would clear security.capability
                self.copy_xattrs(src_fd, dst_fd)
            return method
        finally:
            os.close(src_fd)

    def copy_new(self, src: str, dst: str, mode: int, mtime_ns: int | None = None,
                 xattrs: bool = False) -> str:
        """Create ``dst`` (must not exist) with ``src``'s content, permission bits ``mode``,
        (if given) mtime and (if ``xattrs``) extended attributes. Never follows a symlink at
        either end."""
        dst_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        try:
            method = self.copy_into(src, dst_fd, xattrs)
            os.fchmod(dst_fd, mode)
            if mtime_ns is not None:
                os.utime(dst_fd, ns=(mtime_ns, mtime_ns))
        finally:
            os.close(dst_fd)
        return method


_AT_FDCWD = -100
_AT_SYMLINK_FOLLOW = 0x400


def _libc_linkat() -> Callable[..., int]:
    libc = ctypes.CDLL(None, use_errno=True)
    function = libc.linkat
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                         ctypes.c_int]
    function.restype = ctypes.c_int
    result: Callable[..., int] = function
    return result


_linkat = _libc_linkat()


def link_fd(fd: int, dest: str) -> None:
    """Give the open (e.g. ``O_TMPFILE``) file ``fd`` the name ``dest``.

    ``linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, dest, AT_SYMLINK_FOLLOW)``: the documented
    way to link a nameless file without CAP_DAC_READ_SEARCH (Python's ``os.link`` calls plain
    ``link()`` for two plain paths, which would link the magic symlink itself).
    """
    if _linkat(_AT_FDCWD, f"/proc/self/fd/{fd}".encode(), _AT_FDCWD, os.fsencode(dest),
               _AT_SYMLINK_FOLLOW) != 0:
        err = ctypes.get_errno()
        raise FileExistsError(err, os.strerror(err), dest) if err == errno.EEXIST else \
            OSError(err, os.strerror(err), dest)
