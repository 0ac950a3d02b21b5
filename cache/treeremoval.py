"""Removing a tree through directory descriptors (:func:`remove_at`, :func:`remove_tree`,
:func:`remove_opened`), under the ownership rule of removal.

Entries are examined with ``fstatat(..., AT_SYMLINK_NOFOLLOW)`` and removed with ``unlinkat``
relative to the descriptor of the directory holding them (:mod:`ocistage.cache.dirfds`), by an
iterative walk of bounded descriptors (:class:`ocistage.cache.treewalk.Walk`): any depth, any
path length, no symlink ever followed.

The ownership rule of removal (docs/trust.md): the entry removed must be the caller's when the
directory holding it is one others can write
(:func:`~ocistage.cache.dirtrust.others_can_write`: a sticky ``/tmp``, a world- or
group-writable directory, or one owned by somebody else than the caller or root); inside the
tree, a caller other than root touches only its own entries in world-writable directories (an
image's ``/tmp``: it could not remove others' entries of a sticky one anyway). Others' entries
are left and reported by :class:`~ocistage.cache.errors.UntrustedPath` at the end. Everything
else inside a tree the caller may remove is the tree's own content and goes with it — an
image's files unpacked as root with their own uids, or the mount point slurmstepd makes in a
staged rootfs as the job's user — since nothing reached through descriptors leads outside the
tree; leaving such entries would leave the bundle on the node for good. In the cache, trees are
taken out through :mod:`ocistage.cache.evict` (a rename beside them, then this removal by their
owner, or by root whole: ``own_tree``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from ocistage.cache.dirfds import identity, open_dir, open_parent
from ocistage.cache.dirtrust import others_can_write, world_writable
from ocistage.cache.errors import StoreError, UntrustedPath
from ocistage.cache.treewalk import Frame, Walk


def _make_writable(fd: int, st: os.stat_result) -> None:
    if st.st_mode & 0o700 != 0o700:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o700)



def _open_child(parent: Frame, name: str) -> tuple[int | None, os.stat_result] | None:
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

    def unlink(self, frame: Frame, name: str) -> None:
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

    def list(self, frame: Frame) -> None:
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

    def rmdir(self, parent_fd: int, top: Frame) -> None:
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
        walk = Walk(parent_fd)
        walk.push(Frame(name, os.dup(fd), identity(st),
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
                    walk.push(Frame(child, child_fd, identity(child_st),
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
