"""Room to clean up a full cache: a file of :data:`SIZE` bytes kept at ``CACHE/space-reserve``.

The commands that free space write a little first: GC its lock file and the index, ``unstage``
the lease that makes its removal safe to resume, ``cache rm`` the same as GC. On a filesystem
that pulls and bundles have filled to the last block, those writes fail with ENOSPC and the
cache could never be cleaned by ocistage (the endurance test of issue 39 saw every member's
``cache gc --max-size 0`` fail so). So the cache keeps this reserve, allocated for real
(``posix_fallocate``, not sparse): a command that frees space and finds the filesystem
(nearly) full empties it first (:func:`spent`), does its work, and allocates it again
(:func:`ensure`), as ext4 keeps blocks for root. Everything here is best effort: a reserve that
cannot be made, opened (another member's, without group write) or grown stays as it is, and
nothing fails for it. The reserve is opened without following a link or waiting on a FIFO and
used only when it is a regular file of ours or of a group-shared cache we may write. GC counts
it as what the cache holds that no GC removes (the floor, as its directories), so ``cache gc``
and ``du`` agree, and never removes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

NAME = "space-reserve"
SIZE = 1 << 20  # a lock file, a lease, the index rewritten: a few blocks each


def _open(root: Path, create: bool) -> int | None:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(root / NAME, flags | (os.O_CREAT if create else 0), 0o666)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        return None
    return fd


def ensure(root: Path, *, create: bool = True) -> None:
    """Make ``root``'s reserve :data:`SIZE` bytes on disk if it is less (best effort; made
    only with ``create``: :meth:`ocistage.cache.store.Store.open` makes it)."""
    fd = _open(root, create=create)
    if fd is None:
        return
    try:
        if os.fstat(fd).st_blocks * 512 >= SIZE:
            return
        try:
            os.posix_fallocate(fd, 0, SIZE)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EOPNOTSUPP, errno.EINVAL):
                return
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # no half reserve: the next command tries again
    finally:
        os.close(fd)


def low_on_space(root: Path) -> bool:
    """Whether the filesystem of ``root`` has less than :data:`SIZE` left for its users."""
    try:
        info = os.statvfs(root)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize < SIZE


@contextlib.contextmanager
def spent(root: Path) -> Iterator[None]:
    """Around work that frees space: the reserve emptied first when the filesystem is nearly
    full (so the work's own small writes fit), and made again after it."""
    fd = _open(root, create=False)
    if fd is None:  # none here (not a cache, or another member's we may not write)
        yield
        return
    if low_on_space(root):
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
    os.close(fd)
    try:
        yield
    finally:
        ensure(root, create=False)
