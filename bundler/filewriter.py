"""Finish regular files in a thread of their own: data, owner, mode, xattrs, times, close.

:func:`bundler.layers.apply_layer` makes every name itself, in tar order, in the caller's thread
(``open(O_CREAT | O_EXCL | O_NOFOLLOW)`` relative to a directory descriptor inside the rootfs).
What is left of a regular file once its descriptor exists touches no name at all: ``write``,
``fchown``, ``fchmod``, ``fsetxattr``, ``futimens`` and ``close`` on that descriptor. That is most
of the kernel time of unpacking (copying the data into the page cache, allocating its blocks),
and the GIL is released during each of those calls, so a second thread does it beside the tar
parsing. The order of namespace operations, and with it the safety argument of
``docs/layers.md``, is unchanged: a later entry that replaces, links or whites out a file whose
data is still on its way acts on the name; the data lands in the inode it was created with.

Operations are queued in batches (at most ``BATCH_FILES`` files or ``BATCH_BYTES`` bytes each) on
a queue of ``DEPTH`` batches, which bounds both memory (~``(DEPTH + 2) * BATCH_BYTES``) and the
number of descriptors in flight. Every descriptor handed over is closed exactly once by the
thread, at its ``finish`` or ``discard``. The first error stops the work (later files are only
closed) and is raised in the caller's thread by the next call, or by :meth:`FileWriter.close`.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

BATCH_BYTES = 1 << 20
BATCH_FILES = 32
DEPTH = 4

XATTR_SKIPPABLE = frozenset({errno.EPERM, errno.EACCES, errno.ENOTSUP, errno.EOPNOTSUPP,
                             errno.EINVAL, errno.ERANGE, errno.E2BIG})

_WRITE, _FINISH, _DISCARD = 0, 1, 2


@dataclass(frozen=True, slots=True)
class FileMeta:
    """What a regular file gets once its data is written."""

    mode: int                        # permission bits, setuid/setgid/sticky included
    mtime_ns: int                    # atime and mtime
    owner: tuple[int, int] | None    # (uid, gid), or None to leave the owner alone (rootless)
    xattrs: dict[str, bytes]
    label: str                       # the path as shown in warnings


def set_xattrs(fd: int, label: str, xattrs: dict[str, bytes],
               warn: Callable[[str], None]) -> None:
    """Set ``xattrs`` on ``fd``; those the filesystem or our privileges refuse become warnings."""
    for key, value in xattrs.items():
        try:
            os.setxattr(fd, key, value)
        except OSError as exc:
            if exc.errno not in XATTR_SKIPPABLE:
                raise
            warn(f"{label}: xattr {key} not set ({exc.strerror})")


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def finish_file(fd: int, meta: FileMeta, warn: Callable[[str], None]) -> None:
    """Owner, mode, xattrs and times of a file opened for writing (in this order: a write or
    a chown clears setuid bits, so the mode comes after both)."""
    if meta.owner is not None:
        os.fchown(fd, *meta.owner)
    os.fchmod(fd, meta.mode)
    if meta.xattrs:
        set_xattrs(fd, meta.label, meta.xattrs, warn)
    os.utime(fd, ns=(meta.mtime_ns, meta.mtime_ns))


_Op = tuple[int, int, bytes | FileMeta | None]


class FileWriter:
    """A thread that writes and finishes the files handed to it, in the order given.

    Use as a context manager: leaving it normally waits for every file (and raises the first
    error); leaving it with an exception stops the thread and closes every descriptor.
    """

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._batch: list[_Op] = []
        self._batch_bytes = 0
        self._queue: queue.Queue[list[_Op] | None] = queue.Queue(maxsize=DEPTH)
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="layer-files", daemon=True)
        self._thread.start()

    # -- the caller's side ---------------------------------------------------------------------

    def write(self, fd: int, data: bytes) -> None:
        """Append ``data`` to the file ``fd``.

        Every file handed over ends in :meth:`finish` or :meth:`discard`, even when this
        raises (an earlier file's error): that is when the thread closes its descriptor.
        """
        self._add((_WRITE, fd, data), len(data))

    def finish(self, fd: int, meta: FileMeta) -> None:
        """Set the metadata of ``fd`` once its data is written, then close it."""
        self._add((_FINISH, fd, meta), 0)
        if len(self._batch) >= BATCH_FILES:
            self._flush()

    def discard(self, fd: int) -> None:
        """Close ``fd`` without finishing it (its entry failed)."""
        self._add((_DISCARD, fd, None), 0)

    def close(self) -> None:
        """Wait until every file is written and closed; raise the first error, if any."""
        if self._closed:
            return
        self._closed = True
        self._flush()
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """Stop: files not yet written are only closed. Errors are dropped."""
        if self._closed:
            return
        self._closed = True
        if self._error is None:
            self._error = _Aborted()
        self._flush()
        self._queue.put(None)
        self._thread.join()

    def __enter__(self) -> FileWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    def _add(self, op: _Op, size: int) -> None:
        self._batch.append(op)
        self._batch_bytes += size
        if self._batch_bytes >= BATCH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._batch:
            self._queue.put(self._batch)  # blocks while DEPTH batches wait: bounded memory
            self._batch, self._batch_bytes = [], 0
        error = self._error
        if error is not None and not isinstance(error, _Aborted) and not self._closed:
            raise error

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            for kind, fd, payload in batch:
                if kind == _WRITE:
                    if self._error is None:
                        self._guarded(write_all, fd, payload)
                    continue
                try:
                    if kind == _FINISH and self._error is None:
                        self._guarded(finish_file, fd, payload, self._warn)
                finally:
                    os.close(fd)

    def _guarded(self, function: Callable[..., None], *args: object) -> None:
        try:
            function(*args)
        except BaseException as exc:
            self._error = exc


class _Aborted(Exception):
    """The caller gave up: the remaining files are only closed."""
