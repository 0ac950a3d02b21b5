"""Opening directories and their entries through descriptors, never through a symbolic link.

A directory is opened relative to its parent's descriptor with ``O_NOFOLLOW | O_DIRECTORY``
(:data:`DIR_READ`, :data:`DIR_PATH`); an inode behind an ``O_PATH`` descriptor is changed
through ``/proc/self/fd`` (:func:`chmod_path_fd`), so a swap between lookup and change cannot
redirect it. No symlink is ever followed — also not one swapped in for a directory while an
operation runs (the ``openat`` then fails with ``ELOOP``/``ENOTDIR`` and the entry is treated
as what it now is). The walks (:mod:`ocistage.cache.treewalk`), the removal
(:mod:`ocistage.cache.treeremoval`) and the layer applier are built on these.
"""

from __future__ import annotations

import errno
import os
import stat

#: a directory opened for listing, never through a symlink
DIR_READ = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: a directory opened as a handle only (``O_PATH``), never through a symlink
DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: a directory named by the user: its last component may be a symlink the user chose
DIR_FOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

Identity = tuple[int, int]


def identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino


def chmod_path_fd(path_fd: int, mode: int) -> None:
    """``chmod`` the inode behind an ``O_PATH`` descriptor (never a symlink's target).

    ``fchmod`` refuses ``O_PATH`` descriptors, so this goes through ``/proc/self/fd``, whose
    entry names exactly that inode: a swap between lookup and chmod cannot redirect it.
    Callers check that the inode is not a symlink (``O_NOFOLLOW`` opens guarantee it).
    """
    os.chmod(f"/proc/self/fd/{path_fd}", mode)


def chown_path_fd(path_fd: int, uid: int, gid: int) -> None:
    """``chown`` the inode behind an ``O_PATH`` descriptor, as :func:`chmod_path_fd`."""
    os.chown(f"/proc/self/fd/{path_fd}", uid, gid)


def open_dir(name: str, dir_fd: int | None) -> int:
    """Open directory ``name`` (relative to ``dir_fd``) for listing, never through a link.

    A directory of ours that we may not read or search is first made ``u+rwx`` through an
    ``O_PATH`` descriptor of the inode looked up (:func:`chmod_path_fd`); one of somebody
    else's raises ``PermissionError``.
    """
    try:
        return os.open(name, DIR_READ, dir_fd=dir_fd)
    except PermissionError:
        pass
    path_fd = os.open(name, DIR_PATH, dir_fd=dir_fd)
    try:
        st = os.fstat(path_fd)
        if st.st_uid != os.geteuid():
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
        chmod_path_fd(path_fd, stat.S_IMODE(st.st_mode) | 0o700)
        return os.open(".", DIR_READ, dir_fd=path_fd)
    finally:
        os.close(path_fd)



def open_parent(path: str | os.PathLike[str]) -> tuple[int, str]:
    """The descriptor of ``path``'s parent directory (which may be reached through links the
    user chose) and ``path``'s last component."""
    parent, name = os.path.split(os.path.abspath(path))
    return os.open(parent or "/", DIR_FOLLOW), name
