"""Resolve an image's ``Config.User`` against the ``/etc/passwd`` and ``/etc/group`` of its rootfs.

The rootfs is untrusted data: ``/etc/passwd`` may be a symlink to ``/../../etc/passwd``, ``/etc``
may be a symlink to a host directory, the file may be a FIFO. Files are therefore opened by
walking the path one component at a time from a directory fd of the rootfs, with ``O_NOFOLLOW``
on every component; symlinks are resolved by hand with chroot semantics (``..`` at the root stays
at the root, absolute targets restart at the rootfs), so nothing outside the rootfs is ever read.

Semantics follow image-spec ``conversion.md`` and Docker/runc:

- ``""``/``None`` -> uid 0, gid 0 (home and name from the uid-0 passwd entry when there is one);
- ``user`` or ``uid``: a passwd entry by name (or by uid when numeric) gives uid, gid and home;
  a numeric uid without an entry is used verbatim with gid 0;
- ``user:group`` / ``uid:gid`` / ``user:gid`` / ``uid:group``: the group part overrides the gid
  (a numeric gid verbatim, a name through ``/etc/group``);
- supplementary groups (``additional_gids``) come from ``/etc/group`` membership only when the
  user was given by name and no group was given (conversion.md: not for a numeric user, not when
  a group is specified).

An unknown user or group name is an error (conversion.md: "MUST return an error").
"""

from __future__ import annotations

import os
import stat
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ocistage.cache.dirfds import DIR_PATH
from ocistage.runtimes.errors import UserResolutionError

MAX_ID = 2**32 - 2  # uint32 without the (uid_t)-1 sentinel
_MAX_SYMLINKS = 40
_MAX_LINE = 64 * 1024


@dataclass(frozen=True)
class ResolvedUser:
    uid: int
    gid: int
    additional_gids: tuple[int, ...] = ()
    username: str | None = None
    home: str = "/"


@dataclass(frozen=True)
class PasswdEntry:
    name: str
    uid: int
    gid: int
    home: str


@dataclass(frozen=True)
class GroupEntry:
    name: str
    gid: int
    members: tuple[str, ...]


def resolve_user(rootfs: Path, user: str | None) -> ResolvedUser:
    """Resolve ``Config.User`` (``user[:group]``) to ids, reading the rootfs's user database."""
    spec = user or ""
    user_part, _, group_part = spec.partition(":")
    uid_arg = _parse_id(user_part, "uid")
    gid_arg = _parse_id(group_part, "gid")

    if user_part == "":
        entry = _find_passwd(rootfs, lambda e: e.uid == 0) if group_part == "" else None
        uid, gid = 0, 0
        username, home = (entry.name, entry.home) if entry else (None, "/")
    else:
        if uid_arg is not None:
            entry = _find_passwd(rootfs, lambda e: e.uid == uid_arg)
        else:
            entry = _find_passwd(rootfs, lambda e: e.name == user_part)
        if entry is not None:
            uid, gid, username, home = entry.uid, entry.gid, entry.name, entry.home
        elif uid_arg is not None:
            uid, gid, username, home = uid_arg, 0, None, "/"
        else:
            raise UserResolutionError(f"unable to find user {user_part!r} in the image's "
                                      "/etc/passwd")

    additional: tuple[int, ...] = ()
    if group_part != "":
        gid = gid_arg if gid_arg is not None else _group_id(rootfs, group_part)
    elif uid_arg is None and username is not None and user_part != "":
        additional = _supplementary_gids(rootfs, username, gid)
    return ResolvedUser(uid=uid, gid=gid, additional_gids=additional, username=username,
                        home=home)


def _parse_id(text: str, what: str) -> int | None:
    """A numeric id, or None for a name. Out-of-range numbers are an error."""
    if not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    if value > MAX_ID:
        raise UserResolutionError(f"{what} {text} is out of range (0..{MAX_ID})",
                                  "use a uid/gid that fits in 32 bits")
    return value


def _group_id(rootfs: Path, name: str) -> int:
    for group in read_group(rootfs):
        if group.name == name:
            return group.gid
    raise UserResolutionError(f"unable to find group {name!r} in the image's /etc/group")


def _supplementary_gids(rootfs: Path, username: str, primary_gid: int) -> tuple[int, ...]:
    gids: list[int] = []
    for group in read_group(rootfs):
        if username in group.members and group.gid != primary_gid and group.gid not in gids:
            gids.append(group.gid)
    return tuple(gids)


def _find_passwd(rootfs: Path, match: Callable[[PasswdEntry], bool]) -> PasswdEntry | None:
    for entry in read_passwd(rootfs):
        if match(entry):
            return entry
    return None


def read_passwd(rootfs: Path) -> Iterator[PasswdEntry]:
    """Entries of ``rootfs/etc/passwd`` (none when it does not exist); malformed lines skipped."""
    for fields in _records(rootfs, "etc/passwd"):
        if len(fields) < 7:
            continue
        uid, gid = _field_id(fields[2]), _field_id(fields[3])
        if fields[0] == "" or uid is None or gid is None:
            continue
        yield PasswdEntry(name=fields[0], uid=uid, gid=gid, home=fields[5] or "/")


def read_group(rootfs: Path) -> Iterator[GroupEntry]:
    """Entries of ``rootfs/etc/group`` (none when it does not exist); malformed lines skipped."""
    for fields in _records(rootfs, "etc/group"):
        if len(fields) < 4:
            continue
        gid = _field_id(fields[2])
        if fields[0] == "" or gid is None:
            continue
        members = tuple(member for member in fields[3].split(",") if member)
        yield GroupEntry(name=fields[0], gid=gid, members=members)


def _field_id(text: str) -> int | None:
    if not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if value <= MAX_ID else None


def _records(rootfs: Path, relpath: str) -> Iterator[list[str]]:
    """Colon-separated records of a text file inside the rootfs, streamed line by line."""
    try:
        file = open_in_rootfs(rootfs, relpath)
    except OSError as exc:
        raise UserResolutionError(
            f"cannot read /{relpath} of the image: {exc.strerror or exc}",
            "the image's user database is unreadable; use a numeric User (uid[:gid])",
        ) from exc
    if file is None:
        return
    with file:
        for line in _lines(file):
            text = line.decode("utf-8", "surrogateescape").rstrip("\r\n")
            if text.strip() == "" or text.lstrip().startswith(("#", "+", "-")):
                continue
            yield text.split(":")


def _lines(file: BinaryIO) -> Iterator[bytes]:
    """Lines of at most ``_MAX_LINE`` bytes; longer lines are skipped without being held."""
    skipping = False
    while line := file.readline(_MAX_LINE):
        complete = line.endswith(b"\n")
        if not skipping and (complete or len(line) < _MAX_LINE):
            yield line
        skipping = not complete and len(line) >= _MAX_LINE


def open_in_rootfs(rootfs: Path, relpath: str) -> BinaryIO | None:
    """Open the regular file ``relpath`` inside ``rootfs`` for reading, with chroot semantics.

    Returns None when the path (or a directory on it) does not exist. Raises ``OSError`` for
    anything else: a symlink loop (``ELOOP``), a path that is not a regular file, permissions.
    Symlinks are resolved by hand against the rootfs and every component is opened with
    ``O_NOFOLLOW``, so neither ``..`` nor absolute link targets can reach outside the rootfs.
    """
    stack = [os.open(rootfs, DIR_PATH & ~os.O_NOFOLLOW)]
    parts = deque(_components(relpath))
    links = 0
    try:
        while parts:
            name = parts.popleft()
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            try:
                info = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
            except FileNotFoundError:
                return None
            if stat.S_ISLNK(info.st_mode):
                links += 1
                if links > _MAX_SYMLINKS:
                    raise OSError(40, "too many levels of symbolic links", relpath)
                target = os.readlink(name, dir_fd=stack[-1])
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                parts.extendleft(reversed(_components(target)))
            elif parts:
                if not stat.S_ISDIR(info.st_mode):
                    return None
                stack.append(os.open(name, DIR_PATH, dir_fd=stack[-1]))
            else:
                return _open_regular(name, stack[-1], relpath)
        raise IsADirectoryError(21, "is a directory", relpath)
    finally:
        for fd in stack:
            os.close(fd)


def _open_regular(name: str, dir_fd: int, relpath: str) -> BinaryIO:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(22, "not a regular file", relpath)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _components(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]
