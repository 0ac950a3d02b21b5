"""Opening the small files ocistage reads back: markers, manifests, leases, locks, owner files.

They live in directories others may write into: a sticky stage target (``/tmp``,
``/scratch``), a group-shared cache. A co-tenant can put anything under the name ocistage
will open there: a symlink, a FIFO (an ``open`` for reading waits for a writer, forever), a
huge file, a file of their own with contents of their choosing. So every such file is opened
by :func:`open_own`, and only this way:

- ``O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC``, relative to a directory descriptor where
  the caller holds one: a symlink fails (``ELOOP``) and a FIFO opens at once instead of
  waiting for a writer;
- ``fstat`` of what was opened: it must be a regular file, owned by the caller or root
  (docs/trust.md, rule 1), or, with ``owners="group"`` (the cache), by another member of a
  group-shared cache: a file of the directory's group in a setgid directory of one of the
  caller's groups. ``owners="anyone"`` (a document the user named, such as an OCI layout's
  ``index.json``) only asks for a regular file;
- anything else raises :class:`~ocistage.cache.errors.ForeignFile` and is closed again:
  callers treat it as not theirs — skipped, never removed, never waited for;
- ``O_NONBLOCK`` is cleared before the descriptor is handed back.
"""

from __future__ import annotations

import fcntl
import os
import stat
from typing import Literal

from ocistage.cache.errors import ForeignFile

#: how a file ocistage reads back is opened: never through a symlink, never waiting
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC

#: whose regular files are accepted (see the module docstring)
Owners = Literal["ours", "group", "anyone"]


def group_shared(st: os.stat_result) -> bool:
    """A directory a site marked as group-shared: setgid, of a group the caller is in."""
    return bool(st.st_mode & stat.S_ISGID) and (
        st.st_gid == os.getegid() or st.st_gid in os.getgroups())


def file_problem(st: os.stat_result, owners: Owners,
                 directory: os.stat_result | None = None) -> str | None:
    """Why the file ``st`` is not one ocistage reads back, or None. ``directory``: the
    directory holding it, for ``owners="group"``."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if owners == "anyone" or st.st_uid in (os.geteuid(), 0):
        return None
    if (owners == "group" and directory is not None and group_shared(directory)
            and st.st_gid == directory.st_gid):
        return None
    return f"is owned by uid {st.st_uid}, not by you or root"


def _directory_stat(name: str | os.PathLike[str], dir_fd: int | None) -> os.stat_result | None:
    try:
        if dir_fd is not None and os.path.dirname(name) == "":
            return os.fstat(dir_fd)
        return os.stat(os.path.dirname(os.path.abspath(name)) if dir_fd is None
                       else os.path.dirname(name), dir_fd=dir_fd)
    except OSError:
        return None


def open_own(name: str | os.PathLike[str], dir_fd: int | None = None, *,
             owners: Owners = "ours") -> tuple[int, os.stat_result]:
    """Open the file ``name`` (relative to ``dir_fd`` if given) for reading; returns the
    descriptor (blocking again) and its ``fstat``.

    Raises ``OSError`` as ``open`` does (FileNotFoundError, ``ELOOP`` for a symlink) and
    :class:`ForeignFile` for what is not a file ocistage reads back (see the module docstring).
    """
    fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        directory = _directory_stat(name, dir_fd) if owners == "group" else None
        problem = file_problem(st, owners, directory)
        if problem is not None:
            raise ForeignFile(f"{os.fspath(name)} {problem}; not reading it")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_capped(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes of the open file ``fd`` (ValueError if it holds more)."""
    chunks = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        shown = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
        raise ValueError(f"larger than {shown}, the limit for a document")
    return b"".join(chunks)


def read_own(name: str | os.PathLike[str], limit: int, dir_fd: int | None = None, *,
             owners: Owners = "ours") -> bytes:
    """The bytes of the file :func:`open_own` opens, at most ``limit`` (ValueError beyond)."""
    fd, _ = open_own(name, dir_fd, owners=owners)
    try:
        return read_capped(fd, limit)
    finally:
        os.close(fd)

