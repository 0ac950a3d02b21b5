"""The privileges an image's files carry on the host: setuid and setgid bits, file capabilities.

An image is hostile until proven otherwise. Where its tree is kept in a directory only its
owner may enter (:data:`ocistage.cache.privatedirs.PRIVATE_DIR_MODE`: bundles, snapshots of a
private cache, staged versions, the stage pool), its files keep the image's modes and
``security.capability`` xattrs, so the container sees them as the image says. Where other
users may reach the tree (a group-shared cache, docs/trust.md; a squashfs image unpacked for
a runtime), :func:`strip_privileges` takes them away first, in the still private tree.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ocistage.cache.dirfds import chmod_path_fd, open_parent
from ocistage.cache.notice import Kind, Notice
from ocistage.cache.treewalk import walk_dir_fds

#: the mode bits that make a file run with its owner's or group's ids
SETID_BITS = stat.S_ISUID | stat.S_ISGID
#: the xattr holding a file's capabilities (``setcap``)
CAPABILITY_XATTR = "security.capability"
#: getxattr errors that mean "there is none"
_NO_XATTR = frozenset({errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP})


def strip_privileges(root: Path, *, devices: bool = False) -> int:
    """In the private tree ``root``: clear the setuid and setgid bits of regular files and
    remove their file capabilities; with ``devices``, remove device nodes too. Returns how
    many files lost a privilege.

    Iterative and through directory descriptors (any depth, a bounded number of them, no
    symlink followed); every directory is entered (the caller's own unreadable ones are
    made ``u+rwx`` first) or OSError is raised: a tree only partly stripped is never
    reported as stripped. A file hard-linked elsewhere loses its privileges there too (one
    inode).
    """
    parent_fd, name = open_parent(root)
    stripped = 0
    try:
        for dir_fd, _rel, _dirs, others in walk_dir_fds(parent_fd, name, strict=True):
            stripped += _strip_entries(dir_fd, others, devices)
    finally:
        os.close(parent_fd)
    return stripped


def _strip_entries(dir_fd: int, names: list[str], devices: bool) -> int:
    stripped = 0
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if devices and (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            os.unlink(name, dir_fd=dir_fd)
        elif stat.S_ISREG(st.st_mode):
            stripped += _strip_file(dir_fd, name, st)
    return stripped


def _strip_file(dir_fd: int, name: str, st: os.stat_result) -> bool:
    """Take the capabilities and set-id bits of the regular file ``name`` of ``dir_fd``
    (``st``: its lstat); whether it had any."""
    had = False
    path = f"/proc/self/fd/{dir_fd}/{name}"  # the directory by its descriptor; the file
    try:                                     # itself is never followed
        # looked at first: removing one that is not there takes CAP_SETFCAP all the same
        os.getxattr(path, CAPABILITY_XATTR, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_XATTR:
            raise
    else:
        os.removexattr(path, CAPABILITY_XATTR, follow_symlinks=False)
        had = True
    if st.st_mode & SETID_BITS:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            chmod_path_fd(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~SETID_BITS)
        finally:
            os.close(fd)
        had = True
    return had


def stripped_warning(count: int, where: str) -> tuple[Notice, ...]:
    """The one-line warning of :func:`strip_privileges` having taken privileges from
    ``count`` files (none when 0)."""
    if count == 0:
        return ()
    return (Notice(Kind.PRIVILEGES, f"{count} file(s) of the image lost their setuid/setgid "
                   f"bits and file capabilities: {where} (docs/trust.md)"),)
