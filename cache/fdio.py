"""Writing to file descriptors and creating files: ``os.write`` may write less than it was
given, and a file can only be created with its final mode when the umask keeps that mode."""

from __future__ import annotations

import os


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, however many ``write`` calls it takes."""
    view = memoryview(data)
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
