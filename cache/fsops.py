"""File-system primitives that ocistage uses everywhere: one name per operation.

Everything here works through directory descriptors. A directory is opened relative to its
parent's descriptor with ``O_NOFOLLOW | O_DIRECTORY`` (:data:`DIR_READ`, :data:`DIR_PATH`),
entries are examined with ``fstatat(..., AT_SYMLINK_NOFOLLOW)`` and removed with ``unlinkat``
relative to the descriptor of the directory holding them. No symlink is ever followed — also
not one swapped in for a directory while an operation runs (the ``openat`` then fails with
``ELOOP``/``ENOTDIR`` and the entry is treated as what it now is).

Walks (:func:`remove_at`, :func:`tree_stats`) are iterative and indifferent to depth and to
``PATH_MAX``: no path longer than one name is ever built, no recursion, and at most
:data:`MAX_OPEN_DIRS` descriptors are held. Deeper ancestors are closed and re-opened through
``..`` of their child when the walk climbs back, and re-checked to be the very directory
(``st_dev``, ``st_ino``) that was left: a directory moved away meanwhile stops the walk with
:class:`~ocistage.cache.errors.StoreError` instead of touching whatever is there now.

The ownership rule of removal (docs/trust.md): the entry removed must be the caller's when the
directory holding it is one others can write (:func:`others_can_write`: a sticky ``/tmp``, a
world- or group-writable directory, or one owned by somebody else than the caller or root);
inside the tree, a caller other than root touches only its own entries in world-writable
directories (an image's ``/tmp``: it could not remove others' entries of a sticky one anyway).
Others' entries are left and reported by :class:`~ocistage.cache.errors.UntrustedPath` at the end.
Everything else inside a tree the caller may remove is the tree's own content and goes with
it — an image's files unpacked as root with their own uids, or the mount point slurmstepd
makes in a staged rootfs as the job's user — since nothing reached through descriptors leads
outside the tree; leaving such entries would leave the bundle on the node for good. In the
cache, trees are taken out through :mod:`ocistage.cache.evict` (a rename beside them, then this
removal by their owner, or by root whole: ``own_tree``).

Scratch directories with an owner file (``NAME`` + ``NAME.owner``, the owner's host and pid as
:class:`ocistage.cache.locks.Owner` JSON) are made, dropped and released here too
(:func:`make_owned_dir`, :func:`drop_owned_dir`, :func:`release_owned_dir`).
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ocistage.cache.errors import StoreError, UntrustedPath
from ocistage.cache.fdio import reflink
from ocistage.cache.locks import Owner
from ocistage.cache.readback import group_shared as is_group_shared

#: a directory opened for listing, never through a symlink
DIR_READ = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: a directory opened as a handle only (``O_PATH``), never through a symlink
DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: a directory named by the user: its last component may be a symlink the user chose
DIR_FOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

#: descriptors one walk holds at most (deeper ancestors are re-opened through ``..``)
MAX_OPEN_DIRS = 64
#: the suffix of the owner file beside a scratch directory
OWNER_SUFFIX = ".owner"

Identity = tuple[int, int]


def identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino


# -- ownership ---------------------------------------------------------------------------------

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


# -- every ancestor of a path (docs/trust.md, "Every ancestor") ---------------------------------

#: symbolic links one walk follows at most (the kernel's own limit)
MAX_SYMLINKS = 40
#: the mode of directories :func:`walk_trusted` makes above the one asked for
PARENT_MODE = 0o755
ANCESTOR_HINT = ("use a path whose every directory is yours or root's and not writable by "
                 "others (root's sticky ones like /tmp excepted), e.g. chmod go-w DIR")


def sticky_of_ours(st: os.stat_result) -> bool:
    """A sticky directory owned by the caller or root (``/tmp``): others may add entries, but
    only their owner (and the directory's) can rename or remove them."""
    return (stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX)
            and st.st_uid in (os.geteuid(), 0))


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


# -- opening and chmod -------------------------------------------------------------------------

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


def _make_writable(fd: int, st: os.stat_result) -> None:
    if st.st_mode & 0o700 != 0o700:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o700)


# -- the walker --------------------------------------------------------------------------------

@dataclass
class _Frame:
    name: str                   # the directory's name in its parent
    fd: int                     # -1 while released (too deep); re-opened through ".."
    ident: Identity
    shared: bool                # others can write it: only the caller's entries are touched
    pending: list[str] | None = None   # subdirectories still to visit (None: not listed yet)


@dataclass
class _Walk:
    """A stack of open directories below ``parent_fd`` that holds at most
    :data:`MAX_OPEN_DIRS` descriptors."""

    parent_fd: int
    stack: list[_Frame] = field(default_factory=list)

    def push(self, frame: _Frame) -> None:
        self.stack.append(frame)
        if len(self.stack) > MAX_OPEN_DIRS:
            far = self.stack[-MAX_OPEN_DIRS - 1]
            if far.fd >= 0:
                os.close(far.fd)
                far.fd = -1

    def pop(self) -> tuple[_Frame, int]:
        """Leave the top directory: return it (its fd still open) and its parent's fd."""
        top = self.stack.pop()
        if not self.stack:
            return top, self.parent_fd
        parent = self.stack[-1]
        if parent.fd < 0:
            fd = os.open("..", DIR_READ, dir_fd=top.fd)
            if identity(os.fstat(fd)) != parent.ident:
                os.close(fd)
                raise StoreError(f"{parent.name} was moved while ocistage walked it",
                                 "something else changes this tree; retry when it is done")
            parent.fd = fd
        return top, parent.fd

    def advance(self, top: _Frame, *, unreadable_ok: bool = True) -> None:
        """Enter ``top``'s next pending subdirectory (its frame named by the pending entry,
        opened by its last component; one that cannot be opened is skipped, one the caller
        may not read too unless not ``unreadable_ok``: PermissionError), or leave ``top``
        when none is left."""
        while top.pending:
            child = top.pending.pop()
            try:
                child_fd = os.open(child.rpartition("/")[2], DIR_READ, dir_fd=top.fd)
            except PermissionError:
                if unreadable_ok:
                    continue
                raise
            except OSError:
                continue
            self.push(_Frame(child, child_fd, identity(os.fstat(child_fd)), False))
            return
        done, _ = self.pop()
        os.close(done.fd)

    def close(self) -> None:
        for frame in self.stack:
            if frame.fd >= 0:
                os.close(frame.fd)
        self.stack.clear()


def _open_child(parent: _Frame, name: str) -> tuple[int | None, os.stat_result] | None:
    """Open the subdirectory ``name`` of ``parent``; None if it is gone or is no directory
    (anymore); no descriptor for another user's directory we cannot read where others write."""
    try:
        fd = open_dir(name, parent.fd)
    except FileNotFoundError:
        return None
    except PermissionError:
        st = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
        if not parent.shared or st.st_uid == os.geteuid():
            raise
        return None, st
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            return None
        raise
    return fd, os.fstat(fd)


# -- removal -----------------------------------------------------------------------------------

class _Removal:
    def __init__(self) -> None:
        self.uid = os.geteuid()
        self.skipped: list[str] = []
        #: whether world-writable directories inside the tree keep others' entries (not for
        #: root, who removes the tree whole once its top entry may be removed)
        self.inner_rule = self.uid != 0

    def may_touch(self, shared: bool, st: os.stat_result, where: str) -> bool:
        if not shared or st.st_uid == self.uid:
            return True
        if len(self.skipped) < 5:
            self.skipped.append(f"{where} (owner uid {st.st_uid})")
        else:
            self.skipped.append("")
        return False

    def unlink(self, frame: _Frame, name: str) -> None:
        """Unlink the non-directory ``name``; a directory swapped in is queued instead."""
        if frame.shared:
            try:
                st = os.stat(name, dir_fd=frame.fd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if not self.may_touch(True, st, name):
                return
        try:
            os.unlink(name, dir_fd=frame.fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            assert frame.pending is not None
            frame.pending.append(name)

    def list(self, frame: _Frame) -> None:
        """Unlink the non-directories of ``frame``; remember its subdirectories."""
        frame.pending = []
        with os.scandir(frame.fd) as listing:
            entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
        pending, fd = frame.pending, frame.fd
        for name, is_dir in entries:
            if is_dir:
                pending.append(name)
            elif frame.shared:
                self.unlink(frame, name)
            else:  # the common case inline: one unlinkat per file
                try:
                    os.unlink(name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except IsADirectoryError:  # replaced by a directory since the listing
                    pending.append(name)

    def rmdir(self, parent_fd: int, top: _Frame) -> None:
        """Remove the emptied directory ``top`` from its parent — unless its name no longer
        refers to it (swapped meanwhile: then whatever is there now stays untouched)."""
        try:
            current = os.stat(top.name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if identity(current) != top.ident:
            return
        try:
            os.rmdir(top.name, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY and self.skipped:
                return  # holds entries of others, reported at the end
            if exc.errno != errno.ENOTDIR:  # a symlink swapped in: leave it
                raise

    def run(self, parent_fd: int, name: str, fd: int, parent_shared: bool) -> None:
        st = os.fstat(fd)
        if not self.may_touch(parent_shared, st, name):
            return
        walk = _Walk(parent_fd)
        walk.push(_Frame(name, os.dup(fd), identity(st),
                         self.inner_rule and world_writable(st)))
        try:
            while walk.stack:
                top = walk.stack[-1]
                if top.pending is None:
                    _make_writable(top.fd, os.fstat(top.fd))
                    self.list(top)
                assert top.pending is not None
                if top.pending:
                    child = top.pending.pop()
                    opened = _open_child(top, child)
                    if opened is None:
                        self.unlink(top, child)  # a symlink or file swapped in: never followed
                        continue
                    child_fd, child_st = opened
                    if child_fd is None:  # another user's, unreadable: recorded as left
                        self.may_touch(True, child_st, child)
                        continue
                    if not self.may_touch(top.shared, child_st, child):
                        os.close(child_fd)
                        continue
                    if child_st.st_dev != st.st_dev:
                        os.close(child_fd)
                        raise StoreError(f"{child} is a mount point inside a tree being "
                                         f"removed; not crossing into it", "unmount it first")
                    walk.push(_Frame(child, child_fd, identity(child_st),
                                     self.inner_rule and world_writable(child_st)))
                    continue
                done, holder = walk.pop()
                try:
                    self.rmdir(holder, done)
                finally:
                    os.close(done.fd)
        finally:
            walk.close()

    def report(self, what: str) -> None:
        if self.skipped:
            shown = ", ".join(s for s in self.skipped if s)
            raise UntrustedPath(
                f"left {len(self.skipped)} entries of other users in {what}: {shown}",
                "only entries you own are removed where others can write; ask their owner "
                "or an administrator to remove them")


def remove_opened(parent_fd: int, name: str, fd: int) -> None:
    """Empty the directory open as ``fd`` and remove its entry ``name`` in ``parent_fd``
    (unless ``name`` was swapped for something else meanwhile). ``fd`` stays open."""
    removal = _Removal()
    removal.run(parent_fd, name, fd, others_can_write(os.fstat(parent_fd), removal.uid))
    removal.report(name)


def remove_at(parent_fd: int, name: str, *, own_tree: bool = False) -> None:
    """Remove ``name`` inside ``parent_fd``: a directory with everything below it, anything
    else unlinked (a symlink is never followed). Missing is fine.

    ``own_tree``: ``parent_fd`` is a directory inside a tree that the caller is making (an
    image's rootfs being unpacked, in a directory nobody else reaches), whose entries are its
    content whoever owns them (an image's files unpacked as root with their own uids, in its
    group-writable directories): the ownership rule of removal applies below the tree's top
    only, as for any tree the caller removes."""
    removal = _Removal()
    shared = not own_tree and others_can_write(os.fstat(parent_fd), removal.uid)
    try:
        fd = open_dir(name, parent_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP, errno.EACCES):
            raise
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        allowed = removal.may_touch(shared, st, name)
        if allowed and exc.errno == errno.EACCES:
            raise  # a directory we may remove but cannot open
        if allowed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=parent_fd)  # a symlink or file: unlink, never follow
        removal.report(name)
        return
    try:
        removal.run(parent_fd, name, fd, shared)
    finally:
        os.close(fd)
    removal.report(name)


def open_parent(path: str | os.PathLike[str]) -> tuple[int, str]:
    """The descriptor of ``path``'s parent directory (which may be reached through links the
    user chose) and ``path``'s last component."""
    parent, name = os.path.split(os.path.abspath(path))
    return os.open(parent or "/", DIR_FOLLOW), name


def remove_tree(path: str | os.PathLike[str]) -> None:
    """:func:`remove_at` of ``path``: its last component is never followed, missing is fine."""
    try:
        parent_fd, name = open_parent(path)
    except FileNotFoundError:
        return
    try:
        remove_at(parent_fd, name)
    finally:
        os.close(parent_fd)


# -- walking for sizes -------------------------------------------------------------------------

def tree_stats(parent_fd: int, name: str) -> Iterator[os.stat_result]:
    """``lstat`` results of ``name`` in ``parent_fd`` and, for a directory, of everything
    below it (pre-order; never following a link; entries vanishing meanwhile are skipped)."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    yield st
    if not stat.S_ISDIR(st.st_mode):
        return
    try:
        fd = os.open(name, DIR_READ, dir_fd=parent_fd)
    except OSError:
        return
    walk = _Walk(parent_fd)
    walk.push(_Frame(name, fd, identity(os.fstat(fd)), False))
    try:
        while walk.stack:
            top = walk.stack[-1]
            if top.pending is None:
                top.pending = []
                with os.scandir(top.fd) as listing:
                    names = [entry.name for entry in listing]
                for entry in names:
                    try:
                        est = os.stat(entry, dir_fd=top.fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    yield est
                    if stat.S_ISDIR(est.st_mode):
                        top.pending.append(entry)
            walk.advance(top)  # gone, swapped or unreadable: its entry was counted
    finally:
        walk.close()


def walk_dirs(parent_fd: int, name: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``(relative path, subdirectory names, other names)`` for directory ``name`` in
    ``parent_fd`` (relative path ``""``) and every directory below it, parents first, as
    ``os.fwalk`` would give, but iterative (any depth), with a bounded number of open
    descriptors, never following a link. A subdirectory that cannot be opened is listed but
    not entered; ``name`` itself must open (OSError)."""
    for _fd, rel, dirs, others in walk_dir_fds(parent_fd, name):
        yield rel, dirs, others


def walk_dir_fds(parent_fd: int, name: str, *, strict: bool = False
                 ) -> Iterator[tuple[int, str, list[str], list[str]]]:
    """:func:`walk_dirs` with each directory's descriptor first (open until the next item is
    asked for). ``strict``: every subdirectory is entered (one of the caller's that it may
    not read or search is made ``u+rwx`` first, as :func:`open_dir` does) or the walk raises
    OSError; a subdirectory gone or swapped for a non-directory meanwhile is skipped."""
    def listed(top: _Frame) -> tuple[tuple[int, str, list[str], list[str]], list[str]]:
        dirs: list[str] = []
        others: list[str] = []
        with os.scandir(top.fd) as listing:
            for entry in listing:
                (dirs if entry.is_dir(follow_symlinks=False) else others).append(entry.name)
        return (top.fd, top.name, dirs, others), dirs

    yield from _frames(parent_fd, name, listed, strict=strict)


_Item = TypeVar("_Item")


def _frames(parent_fd: int, name: str,
            listed: Callable[[_Frame], tuple[_Item, list[str]]], *,
            strict: bool = False, readable: bool = False) -> Iterator[_Item]:
    """The descriptor walk of :func:`walk_dir_fds` and :func:`walk_entries`: ``listed`` reads
    a directory (its frame) into what is yielded for it and the names of its subdirectories,
    which are entered in that order after the item was yielded (``strict``: as
    :func:`walk_dir_fds` says)."""
    fd = os.open(name, DIR_READ, dir_fd=parent_fd)
    walk = _Walk(parent_fd)
    walk.push(_Frame("", fd, identity(os.fstat(fd)), False))
    try:
        while walk.stack:
            top = walk.stack[-1]
            if top.pending is None:
                item, subdirs = listed(top)
                yield item
                prefix = f"{top.name}/" if top.name else ""
                top.pending = [prefix + d for d in reversed(subdirs)]
            if strict:
                _enter_strictly(walk, top)
            else:  # gone, swapped or (unless readable) unreadable: listed, not entered
                walk.advance(top, unreadable_ok=not readable)
    finally:
        walk.close()


def _enter_strictly(walk: _Walk, top: _Frame) -> None:
    """:meth:`_Walk.advance` that enters every subdirectory it can find (:func:`open_dir`) and
    raises when one cannot be opened."""
    while top.pending:
        child = top.pending.pop()
        try:
            child_fd = open_dir(child.rpartition("/")[2], top.fd)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                continue
            raise
        walk.push(_Frame(child, child_fd, identity(os.fstat(child_fd)), False))
        return
    done, _ = walk.pop()
    os.close(done.fd)


def walk_entries(parent_fd: int, name: str, *, readable: bool = False
                 ) -> Iterator[tuple[str, list[tuple[str, os.stat_result]]]]:
    """``(relative path, [(entry name, lstat result), ...])`` for directory ``name`` in
    ``parent_fd`` (relative path ``""``) and every directory below it, as :func:`walk_dirs`
    (iterative, bounded descriptors, never following a link, a subdirectory that cannot be
    opened listed but not entered), in one order for one tree: each directory's entries
    sorted by name, directories in pre-order, subdirectories in name order. An entry that
    vanishes between listing and ``lstat`` raises FileNotFoundError. ``readable``: a
    subdirectory the caller may not read (another user's 0700 one) raises PermissionError
    instead of being skipped: a walk that must see everything cannot answer then."""
    def listed(top: _Frame) -> tuple[tuple[str, list[tuple[str, os.stat_result]]], list[str]]:
        with os.scandir(top.fd) as listing:  # stat(): fstatat in top.fd
            entries = [(entry.name, entry.stat(follow_symlinks=False)) for entry in listing]
        entries.sort(key=_first)
        return (top.name, entries), [entry for entry, st in entries if stat.S_ISDIR(st.st_mode)]

    yield from _frames(parent_fd, name, listed, readable=readable)


def _first(pair: tuple[str, os.stat_result]) -> str:
    return pair[0]


def path_stats(path: str | os.PathLike[str]) -> Iterator[os.stat_result]:
    """:func:`tree_stats` of ``path`` (its last component never followed)."""
    try:
        parent_fd, name = open_parent(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        yield from tree_stats(parent_fd, name)
    finally:
        os.close(parent_fd)


# -- directories that hold an image's rootfs -----------------------------------------------------

#: the mode of a directory that holds an image's rootfs (a bundle, a snapshot, a staged
#: version, the stage pool): owner-only, so that no other user of the host can reach the
#: image's setuid/setgid files and file capabilities through it (docs/trust.md)
PRIVATE_DIR_MODE = 0o700


def make_private(path: Path) -> None:
    """Make the caller's directory ``path`` (never a symlink's target) owner-only
    (:data:`PRIVATE_DIR_MODE`) if others may enter it: one made before ocistage kept such
    directories private. Another user's directory is left as it is."""
    fd = os.open(path, DIR_PATH)
    try:
        st = os.fstat(fd)
        if owned_by_caller(st) and stat.S_IMODE(st.st_mode) != PRIVATE_DIR_MODE:
            chmod_path_fd(fd, PRIVATE_DIR_MODE)
    finally:
        os.close(fd)


# -- hard links -------------------------------------------------------------------------------

#: ``link()`` errors that mean "no hard link here, copy instead": another mount (two mount
#: points of one filesystem give EXDEV although ``st_dev`` is the same), a source we do not
#: own under ``protected_hardlinks``, a file at its link limit
LINK_REFUSED = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK})


def link_refused(exc: OSError) -> bool:
    """Whether ``exc`` from ``link()`` means the caller should copy instead."""
    return exc.errno in LINK_REFUSED


def hardlinks_work(source: Path, directory: Path) -> bool:
    """Whether the regular file ``source`` can be hard-linked into ``directory``: tried for
    real with a probe name that is removed again (comparing ``st_dev`` is not enough)."""
    probe = directory / f".ocistage-link-probe-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        os.link(source, probe, follow_symlinks=False)
    except OSError as exc:
        if link_refused(exc):
            return False
        raise
    os.unlink(probe)
    return True


def reflinks_work(source_dir: Path, directory: Path) -> bool:
    """Whether a file in ``source_dir`` can be cloned into ``directory`` by reflink (FICLONE:
    btrfs, XFS, bcachefs; the two on one filesystem): tried for real with two probe files
    that are removed again. A reflinked copy shares extents, so it costs metadata only."""
    tag = f".ocistage-reflink-probe-{os.getpid()}-{os.urandom(4).hex()}"
    source, probe = source_dir / tag, directory / tag
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        src_fd = os.open(source, flags, 0o600)
    except OSError:
        return False
    try:
        os.write(src_fd, b"x")
        dst_fd = os.open(probe, flags, 0o600)
        try:
            return reflink(src_fd, dst_fd)
        finally:
            os.close(dst_fd)
            os.unlink(probe)
    except OSError:
        return False
    finally:
        os.close(src_fd)
        os.unlink(source)


# -- scratch directories with an owner file ----------------------------------------------------

def owner_file(directory: Path) -> Path:
    """The owner file beside the scratch directory ``directory``."""
    return directory.parent / f"{directory.name}{OWNER_SUFFIX}"


def make_owned_dir(directory: Path, mode: int = 0o700) -> Path:
    """Create scratch ``directory`` and, beside it, its owner file (this host and pid), so
    that the directory of a process that died can be told from one still being built."""
    owner = Owner.me()
    owner_file(directory).write_text(owner.to_json())
    try:
        directory.mkdir(mode=mode)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            owner_file(directory).unlink()
        raise
    return directory


def release_owned_dir(directory: Path) -> None:
    """Forget the owner file of ``directory`` once the directory was renamed into place."""
    with contextlib.suppress(FileNotFoundError):
        owner_file(directory).unlink()


def drop_owned_dir(directory: Path) -> None:
    """Remove scratch ``directory`` (through descriptors) and then its owner file."""
    remove_tree(directory)
    release_owned_dir(directory)
