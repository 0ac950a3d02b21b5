"""Walking a tree through directory descriptors: iterative, any depth and path length, never
following a link, holding at most :data:`MAX_OPEN_DIRS` descriptors.

No path longer than one name is ever built and there is no recursion. Deeper ancestors are
closed and re-opened through ``..`` of their child when the walk climbs back, and re-checked to
be the very directory (``st_dev``, ``st_ino``) that was left: a directory moved away meanwhile
stops the walk with :class:`~ocistage.cache.errors.StoreError` instead of touching whatever is
there now. :class:`Walk` is that stack of descriptors (also the removal's,
:mod:`ocistage.cache.treeremoval`); :func:`tree_stats`, :func:`walk_dirs`,
:func:`walk_dir_fds` and :func:`walk_entries` are the walks built on it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from ocistage.cache.dirfds import DIR_READ, Identity, identity, open_dir, open_parent
from ocistage.cache.errors import StoreError

#: descriptors one walk holds at most (deeper ancestors are re-opened through ``..``)
MAX_OPEN_DIRS = 64


@dataclass
class Frame:
    """One directory of a :class:`Walk`."""

    name: str                   # the directory's name in its parent
    fd: int                     # -1 while released (too deep); re-opened through ".."
    ident: Identity
    shared: bool                # others can write it: only the caller's entries are touched
    pending: list[str] | None = None   # subdirectories still to visit (None: not listed yet)


@dataclass
class Walk:
    """A stack of open directories below ``parent_fd`` that holds at most
    :data:`MAX_OPEN_DIRS` descriptors."""

    parent_fd: int
    stack: list[Frame] = field(default_factory=list)

    def push(self, frame: Frame) -> None:
        self.stack.append(frame)
        if len(self.stack) > MAX_OPEN_DIRS:
            far = self.stack[-MAX_OPEN_DIRS - 1]
            if far.fd >= 0:
                os.close(far.fd)
                far.fd = -1

    def pop(self) -> tuple[Frame, int]:
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

    def advance(self, top: Frame, *, unreadable_ok: bool = True) -> None:
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
            self.push(Frame(child, child_fd, identity(os.fstat(child_fd)), False))
            return
        done, _ = self.pop()
        os.close(done.fd)

    def close(self) -> None:
        for frame in self.stack:
            if frame.fd >= 0:
                os.close(frame.fd)
        self.stack.clear()



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
    walk = Walk(parent_fd)
    walk.push(Frame(name, fd, identity(os.fstat(fd)), False))
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
    def listed(top: Frame) -> tuple[tuple[int, str, list[str], list[str]], list[str]]:
        dirs: list[str] = []
        others: list[str] = []
        with os.scandir(top.fd) as listing:
            for entry in listing:
                (dirs if entry.is_dir(follow_symlinks=False) else others).append(entry.name)
        return (top.fd, top.name, dirs, others), dirs

    yield from _frames(parent_fd, name, listed, strict=strict)


_Item = TypeVar("_Item")


def _frames(parent_fd: int, name: str,
            listed: Callable[[Frame], tuple[_Item, list[str]]], *,
            strict: bool = False, readable: bool = False) -> Iterator[_Item]:
    """The descriptor walk of :func:`walk_dir_fds` and :func:`walk_entries`: ``listed`` reads
    a directory (its frame) into what is yielded for it and the names of its subdirectories,
    which are entered in that order after the item was yielded (``strict``: as
    :func:`walk_dir_fds` says)."""
    fd = os.open(name, DIR_READ, dir_fd=parent_fd)
    walk = Walk(parent_fd)
    walk.push(Frame("", fd, identity(os.fstat(fd)), False))
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


def _enter_strictly(walk: Walk, top: Frame) -> None:
    """:meth:`Walk.advance` that enters every subdirectory it can find (:func:`open_dir`) and
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
        walk.push(Frame(child, child_fd, identity(os.fstat(child_fd)), False))
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
    def listed(top: Frame) -> tuple[tuple[str, list[tuple[str, os.stat_result]]], list[str]]:
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
