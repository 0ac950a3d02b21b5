"""Walking a path from ``/`` through directory descriptors, checking every directory on the way
(docs/trust.md, "Every ancestor"): :func:`walk_trusted`, :func:`check_path_trusted`."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from ocistage.cache.dirfds import DIR_PATH
from ocistage.cache.dirtrust import sticky_of_ours, trust_problem, user_name
from ocistage.cache.errors import StoreError, UntrustedPath

#: symbolic links one walk follows at most (the kernel's own limit)
MAX_SYMLINKS = 40
#: the mode of directories :func:`walk_trusted` makes above the one asked for
PARENT_MODE = 0o755
ANCESTOR_HINT = ("use a path whose every directory is yours or root's and not writable by "
                 "others (root's sticky ones like /tmp excepted), e.g. chmod go-w DIR")


def _components(path: str) -> list[str]:
    """The components of ``path`` still to walk, last first (a stack)."""
    return [name for name in reversed(path.split("/")) if name not in ("", ".")]


class _AncestorWalk:
    """The descriptors (from ``/``) of one :func:`walk_trusted` and what they are called."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self.fds = [os.open("/", DIR_PATH)]
        self.shown = ["/"]
        self.links = 0

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)

    def climb(self) -> None:
        """``..``: back to the directory the current one was reached from (``/`` stays)."""
        if len(self.fds) > 1:
            os.close(self.fds.pop())
            self.shown.pop()

    def enter(self, name: str) -> None:
        fd = os.open(name, DIR_PATH, dir_fd=self.fds[-1])  # the entry checked: not a link
        self.fds.append(fd)
        self.shown.append(os.path.join(self.shown[-1], name))

    def follow(self, name: str) -> list[str]:
        """The components of the link ``name`` (in the current directory) to walk next."""
        self.links += 1
        if self.links > MAX_SYMLINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fspath(self.path))
        target = os.readlink(name, dir_fd=self.fds[-1])
        if target.startswith("/"):
            while len(self.fds) > 1:
                self.climb()
        return _components(target)

    def refuse(self, problem: str) -> UntrustedPath:
        return UntrustedPath(f"refusing {self.what} {self.path}: {problem}", ANCESTOR_HINT)

    def check_holder(self) -> bool:
        """Raise unless the current directory is trusted or a sticky one of root's (or the
        caller's); True for the latter: the entry looked up there must be checked too."""
        holder = os.fstat(self.fds[-1])
        problem = trust_problem(holder)
        if problem is None:
            return False
        if not sticky_of_ours(holder):
            raise self.refuse(f"its directory {self.shown[-1]} {problem}")
        return True

    def check_entry(self, name: str, st: os.stat_result) -> None:
        """Raise unless ``name`` (whose ``lstat`` is ``st``), in a sticky directory others
        write into, is the caller's or root's: only they can rename or remove it there."""
        if st.st_uid not in (os.geteuid(), 0):
            here = self.shown[-1]
            raise self.refuse(
                f"{os.path.join(here, name)} in the sticky directory {here} is owned by "
                f"{user_name(st.st_uid)}, not by you ({user_name(os.geteuid())}) or root")

    def lookup(self, name: str, make: int | None) -> os.stat_result:
        """``lstat`` of ``name`` in the current directory, made (mode ``make``) if missing."""
        if make is not None:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, make, dir_fd=self.fds[-1])
        return os.stat(name, dir_fd=self.fds[-1], follow_symlinks=False)


def walk_trusted(path: Path, what: str, *, make: int | None = None,
                 follow: bool = True) -> os.stat_result:
    """Walk ``path`` from ``/`` through directory descriptors and return the ``lstat`` of
    its last component (``stat`` of where it leads with ``follow``), after checking every
    directory on the way (as OpenSSH's StrictModes, docs/trust.md): each must pass
    :func:`trust_problem`, except a sticky directory of root's or the caller's (``/tmp``),
    where the entry looked up must then be the caller's or root's. The last component itself
    is left to the caller to judge.

    Nothing is looked up twice by name: each directory is opened (``O_NOFOLLOW``) relative
    to the descriptor of the one checked before it, and a directory that passed cannot be
    changed by anybody but the caller and root, so the answer stays true after the walk.
    A symbolic link on the way is followed (at most :data:`MAX_SYMLINKS`), since it lies in
    a checked directory: its owner is the caller or root, who chose where it leads; its
    target is walked the same way. ``make``: missing components are created (the last with
    mode ``make``, those above with :data:`PARENT_MODE`). Raises :class:`UntrustedPath`, or
    ``OSError`` (``ENOENT``, ``ENOTDIR``, ``ELOOP``, ...) as the system reports it.
    """
    walk = _AncestorWalk(path, what)
    pending = _components(os.path.abspath(path))
    try:
        while pending:
            name = pending.pop()
            if name == "..":
                walk.climb()
                continue
            last = not pending
            sticky = walk.check_holder()  # before anything is made in it
            st = walk.lookup(name, None if make is None else make if last else PARENT_MODE)
            if sticky:
                walk.check_entry(name, st)
            if stat.S_ISLNK(st.st_mode) and (follow or not last):
                pending.extend(walk.follow(name))
                continue
            if last:
                return st
            walk.enter(name)
        return os.fstat(walk.fds[-1])
    finally:
        walk.close()


def check_path_trusted(path: Path, what: str, *, make: int | None = None,
                       shared: bool = False, follow: bool = True) -> None:
    """Raise :class:`UntrustedPath` unless ``path`` and every directory above it are trusted
    (:func:`walk_trusted`); ``path`` itself must pass :func:`trust_problem`, or with
    ``shared`` may also be a sticky directory of root's or the caller's (then only entries
    checked on their own are used in it). ``make``: create what is missing (``path`` with
    mode ``make``). Other failures are :class:`StoreError`."""
    try:
        st = walk_trusted(path, what, make=make, follow=follow)
    except OSError as exc:
        raise StoreError(f"cannot examine {what} {path}: {exc.strerror}") from exc
    if shared and sticky_of_ours(st):
        return
    problem = trust_problem(st)
    if problem is not None:
        raise UntrustedPath(f"refusing {what} {path}: it {problem}", ANCESTOR_HINT)
