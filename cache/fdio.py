"""Writing to file descriptors, creating files with their final mode, and reflinks.

``os.write`` may write less than it was
given, and a file can only be created with its final mode when the umask keeps that mode;
cloning one file's extents into another (reflink)."""

from __future__ import annotations

import errno
import fcntl
import os

FICLONE = 0x40049409  # _IOW(0x94, 9, int) from linux/fs.h
#: what a reflink or an in-kernel copy answers where it is not supported here (another
#: filesystem, no extent sharing, a file it cannot take): fall back, never fail
UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL,
                         errno.ENOSYS, errno.EBADF, errno.ETXTBSY, errno.EPERM})


def reflink(src_fd: int, dst_fd: int) -> bool:
    """Clone ``src_fd``'s extents into ``dst_fd``; False where reflinks are not supported."""
    try:
        fcntl.ioctl(dst_fd, FICLONE, src_fd)
    except OSError as exc:
        if exc.errno in UNSUPPORTED:
            return False
        raise
    return True


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to ``fd``, however many ``write`` calls it takes (one, for a
    small file: no view is made then)."""
    written = os.write(fd, data)
    if written == len(data):
        return
    view = memoryview(data)[written:]
    while view:
        view = view[os.write(fd, view):]


def write_new_file(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Create ``path`` holding ``data``: it must not exist yet and is never reached through a
    symlink (``O_EXCL``: a symlink planted there fails with EEXIST)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def process_umask() -> int | None:
    """This process's umask, from ``/proc/self/status`` (``os.umask`` can only read it by
    changing it, which races with other threads); None where that cannot be read."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        return None
    return None


def created_exactly(mode: int, umask: int | None) -> bool:
    """Whether ``open(..., O_CREAT, mode)`` gives a file exactly ``mode``, so no ``fchmod``
    is needed after writing it: no bit the umask strips, and no set-id or sticky bit (a
    write by an owner without CAP_FSETID clears set-id bits: those are set after)."""
    return umask is not None and mode & (0o7000 | umask) == 0
