"""Extended attributes of staged files: a digest to notice a change, and copying them.

Hardlink staging keeps a file's xattrs (the staged file is the source's inode) and so does a
squashfs image; a pool entry or an independent copy gets them copied here: ``user.*``,
``security.capability`` (file capabilities: only where the caller may set them), POSIX ACLs,
whatever the source has, but ``security.selinux`` (a label the target's policy assigns, not
the image). What the target refuses (no xattrs on that filesystem, no privilege) is skipped
and counted: the stage warns once with the count (:data:`SKIPPED_ERRNOS`).

The manifest records each file's :func:`digest` (:mod:`ocistage.stagers.filemanifest`), so a
change of xattrs only is a change. It is read where a file is new or its ``st_ctime`` moved
(setting an xattr moves it, as any inode change does): an unchanged tree costs no call here.
"""

from __future__ import annotations

import errno
import os

import xxhash

#: not copied, not part of the digest: the target's policy labels files
EXCLUDED = frozenset({"security.selinux"})
#: setxattr errors that mean "not here": unsupported, not permitted, too big for the target
SKIPPED_ERRNOS = frozenset({errno.EPERM, errno.EACCES, errno.ENOTSUP, errno.EOPNOTSUPP,
                            errno.ENOSPC, errno.E2BIG, errno.ERANGE, errno.EINVAL})
_UNSUPPORTED = frozenset({errno.ENOTSUP, errno.EOPNOTSUPP})

Target = int | str


def _names(target: Target) -> list[str]:
    """The xattr names of ``target`` (a descriptor, or a path never followed) we deal with."""
    try:
        if isinstance(target, int):
            names = os.listxattr(target)
        else:
            names = os.listxattr(target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return []
        raise
    return sorted(name for name in names if name not in EXCLUDED)


def _value(target: Target, name: str) -> bytes | None:
    try:
        if isinstance(target, int):
            return os.getxattr(target, name)
        return os.getxattr(target, name, follow_symlinks=False)
    except OSError as exc:
        if exc.errno == errno.ENODATA:  # removed meanwhile
            return None
        raise


def digest(target: Target) -> str:
    """The xxh3-128 of the (name, value) pairs of ``target``'s xattrs; "" when it has none
    (the common case: one ``listxattr``)."""
    names = _names(target)
    if not names:
        return ""
    hasher = xxhash.xxh3_128()
    for name in names:
        value = _value(target, name)
        if value is None:
            continue
        encoded = os.fsencode(name)
        hasher.update(len(encoded).to_bytes(4, "little") + encoded)
        hasher.update(len(value).to_bytes(8, "little") + value)
    return hasher.hexdigest()


def copy(src_fd: int, dst_fd: int) -> int:
    """Give the open file ``dst_fd`` the xattrs of ``src_fd``; returns how many the target
    refused (:data:`SKIPPED_ERRNOS`)."""
    refused = 0
    for name in _names(src_fd):
        value = _value(src_fd, name)
        if value is None:
            continue
        try:
            os.setxattr(dst_fd, name, value)
        except OSError as exc:
            if exc.errno not in SKIPPED_ERRNOS:
                raise
            refused += 1
    return refused
