"""The trust rule for one directory (docs/trust.md): whether others can write it, and whether
ocistage may write into it or read back from it.

A trusted directory is owned by the caller or root and not writable by others
(:func:`trust_problem`); a group-shared cache (setgid, of one of the caller's groups) may also
be group-writable and owned by another member. Every directory above a path is checked by
:mod:`ocistage.cache.ancestors`.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from ocistage.cache.errors import StoreError, UntrustedPath
from ocistage.cache.readback import group_shared as is_group_shared


def others_can_write(st: os.stat_result, uid: int | None = None) -> bool:
    """Whether somebody besides ``uid`` (default: the caller) and root can change entries of
    the directory ``st``: it is group- or world-writable, or another user owns it."""
    uid = os.geteuid() if uid is None else uid
    return st.st_uid not in (uid, 0) or bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def world_writable(st: os.stat_result) -> bool:
    """Whether every user can add entries to the directory ``st`` (sticky or not)."""
    return bool(st.st_mode & stat.S_IWOTH)


def owned_by_caller(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid()


def user_name(uid: int) -> str:
    """``name (uid N)`` for messages, or ``uid N`` where the user database does not know it."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _private_group(gid: int) -> bool:
    """The caller's own user-private group (the group named like the user, holding no one
    else): group write then is no one else's write, as with umask 002 on Fedora or Ubuntu."""
    if gid != os.getegid():
        return False
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}


def trust_problem(st: os.stat_result, *, group_shared: bool = False) -> str | None:
    """Why the directory ``st`` is not trusted for ocistage to write into or read back from,
    or None (docs/trust.md): it must be owned by the caller or root and not be writable by
    others. ``group_shared`` (the cache): a setgid directory of one of the caller's groups
    may also be group-writable and owned by another member."""
    uid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    shared = group_shared and is_group_shared(st)
    if st.st_uid not in (uid, 0) and not shared:
        return f"is owned by {user_name(st.st_uid)}, not by you ({user_name(uid)}) or root"
    if st.st_mode & stat.S_IWOTH:
        return f"is writable by every user (owner {user_name(st.st_uid)})"
    if st.st_mode & stat.S_IWGRP and not shared and not _private_group(st.st_gid):
        return (f"is writable by group {st.st_gid} (owner {user_name(st.st_uid)}); a "
                f"group-shared cache is a setgid directory (chmod g+s) of your group")
    return None


def check_trusted_dir(path: Path, what: str, *, group_shared: bool = False,
                      follow: bool = False) -> None:
    """Raise :class:`UntrustedPath` naming ``path`` and its owner unless it passes
    :func:`trust_problem`. ``follow``: ``path`` was named by the user, who may have meant a
    symlink; directories ocistage makes itself are never reached through one."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError as exc:
        raise StoreError(f"cannot examine {what} {path}: {exc.strerror}") from exc
    problem = trust_problem(st, group_shared=group_shared)
    if problem is not None:
        raise UntrustedPath(f"refusing {what} {path}: it {problem}")


def check_shared_parent(path: Path, what: str, *, group_shared: bool = False) -> None:
    """Like :func:`check_trusted_dir` for a directory that may also be a sticky one others
    write into, such as ``/tmp`` or ``/scratch`` (then only the caller's entries in it are
    used, each checked by :func:`check_trusted_dir`)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise StoreError(f"cannot examine {what} {path}: {exc.strerror}") from exc
    if st.st_mode & stat.S_ISVTX and stat.S_ISDIR(st.st_mode) and st.st_uid in (
            os.geteuid(), 0):
        return
    check_trusted_dir(path, what, group_shared=group_shared, follow=True)



def sticky_of_ours(st: os.stat_result) -> bool:
    """A sticky directory owned by the caller or root (``/tmp``): others may add entries, but
    only their owner (and the directory's) can rename or remove them."""
    return (stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX)
            and st.st_uid in (os.geteuid(), 0))
