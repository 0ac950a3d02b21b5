"""Removing a tree through directory file descriptors, so that no symlink can redirect it.

Every directory is opened relative to its parent's descriptor with ``O_NOFOLLOW |
O_DIRECTORY``, every unlink/rmdir is relative to the descriptor of the directory holding the
entry. A symlink is only ever unlinked, never followed — also when one is swapped in for a
directory while the removal runs (the ``openat`` then fails with ``ELOOP``/``ENOTDIR`` and the
entry is unlinked as what it now is). Read-only and mode-000 directories are made ``u+rwx``
through an ``O_PATH`` descriptor of the very inode that was looked up, so a swap between lookup
and chmod cannot make us chmod something else.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(name: str, dir_fd: int | None) -> int:
    """Open directory ``name`` (relative to ``dir_fd``) for listing, without following links.

    A directory we may not read or search is first made ``u+rwx`` (we own what we remove).
    """
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        pass
    path_fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
    try:
        mode = os.fstat(path_fd).st_mode
        # chmod through /proc/self/fd pins the inode we looked up (fchmod refuses O_PATH fds)
        os.chmod(f"/proc/self/fd/{path_fd}", stat.S_IMODE(mode) | 0o700)
        return os.open(f"/proc/self/fd/{path_fd}", _DIR_FLAGS & ~os.O_NOFOLLOW)
    finally:
        os.close(path_fd)


def _make_writable(fd: int) -> None:
    mode = os.fstat(fd).st_mode
    if mode & 0o700 != 0o700:
        os.fchmod(fd, stat.S_IMODE(mode) | 0o700)


def clear_dir(fd: int) -> None:
    """Remove everything inside the open directory ``fd`` (which itself stays)."""
    _make_writable(fd)
    with os.scandir(fd) as listing:
        names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
    for name, is_dir in names:
        if is_dir:
            remove_entry(fd, name)
        else:
            try:
                os.unlink(name, dir_fd=fd)
            except IsADirectoryError:  # replaced by a directory since the listing
                remove_entry(fd, name)
            except FileNotFoundError:
                pass


def remove_entry(parent_fd: int, name: str) -> None:
    """Remove ``name`` inside ``parent_fd``: a directory recursively, anything else unlinked."""
    try:
        fd = open_dir(name, parent_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent_fd)  # a symlink or file: unlink, never follow
        return
    try:
        remove_opened(parent_fd, name, fd)
    finally:
        os.close(fd)


def remove_opened(parent_fd: int, name: str, fd: int) -> None:
    """Empty the directory open as ``fd`` and remove its entry ``name`` in ``parent_fd`` —
    unless ``name`` no longer refers to that directory (swapped meanwhile): then only its former
    contents are gone and whatever ``name`` is now stays untouched."""
    clear_dir(fd)
    expected = os.fstat(fd)
    try:
        current = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if (current.st_dev, current.st_ino) != (expected.st_dev, expected.st_ino):
        return  # swapped while we emptied it: leave whatever is there now alone
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOTDIR:  # a symlink swapped in: leave it
            raise


def remove_path(path: str) -> None:
    """Remove ``path`` (an absolute or relative path) through descriptors; missing is fine.

    The last component is never followed: if it is a symlink, only the link goes.
    """
    parent, name = os.path.split(os.path.abspath(path))
    parent_fd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        remove_entry(parent_fd, name)
    finally:
        os.close(parent_fd)
