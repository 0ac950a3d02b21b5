"""A count that this process, its threads and the processes it forks afterwards add to.

Eight bytes of a shared memory file (``memfd``, mapped shared: a fork inherits the mapping),
added to under a POSIX record lock on that file (between processes; the kernel drops the lock
of a process that dies holding it) and a lock of this process (between its threads; made anew
in a forked child, which may have been forked while another thread held it).

It stands in for ``multiprocessing.Value``, whose first use in a process imports
multiprocessing and makes a shared heap and a named semaphore: about 10 ms, paid by every
re-stage's worker before it placed a file (:mod:`ocistage.stagers.copy`).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
import weakref

_COUNT = struct.Struct("q")


class SharedCount:
    """A signed 64-bit count shared with processes forked after it was made."""

    def __init__(self) -> None:
        self._fd = os.memfd_create("ocistage-count", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self._fd, _COUNT.size)
            self._map = mmap.mmap(self._fd, _COUNT.size)
        except BaseException:
            os.close(self._fd)
            raise
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _release, self._map, self._fd)
        _COUNTS.add(self)

    @property
    def value(self) -> int:
        """The count now."""
        return int(_COUNT.unpack_from(self._map)[0])

    def add(self, amount: int) -> None:
        """Add ``amount`` to the count."""
        with self._lock:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
            try:
                _COUNT.pack_into(self._map, 0, _COUNT.unpack_from(self._map)[0] + amount)
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def _forked(self) -> None:
        self._lock = threading.Lock()


def _release(shared: mmap.mmap, fd: int) -> None:
    shared.close()
    os.close(fd)


#: the counts of this process, whose thread locks a forked child makes anew
_COUNTS: weakref.WeakSet[SharedCount] = weakref.WeakSet()


def _after_fork() -> None:
    for count in list(_COUNTS):
        count._forked()


os.register_at_fork(after_in_child=_after_fork)
