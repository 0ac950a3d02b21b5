"""Lock files with an owner and a heartbeat, safe on shared filesystems.

Locks here only avoid *duplicate work* (two nodes downloading the same blob); correctness never
depends on them, because everything is published by an atomic ``rename()``. So they must not rely
on ``fcntl`` locks, which NFS/Lustre/GPFS do not always make coherent. A lock is a file created
with ``O_CREAT | O_EXCL`` (atomic on NFSv3+ and every cluster filesystem) holding its owner's
host, pid and process start time; the owner refreshes the file's mtime every ``heartbeat``
seconds from a background thread. A lock is *stale*, and may be broken, when its owner is on this
host and is dead (pid gone, or reused by another process), or when its mtime is older than
``stale_after`` (an owner on another host that stopped heart-beating).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ocistage.cache.errors import ForeignFile, LockTimeout, StoreError
from ocistage.cache.jsondoc import parse_json
from ocistage.cache.nodes import host_name
from ocistage.cache.readback import open_own, read_capped

HEARTBEAT_SECONDS = 5.0
STALE_AFTER_SECONDS = 60.0
MAX_LOCK_BYTES = 64 << 10


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (the state first), None if
    ``pid`` is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may contain spaces or parentheses
    return data[data.rfind(b")") + 2 :].split()


def _process_start_time(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat); None
    if it is gone, or has exited and waits to be reaped (a zombie holds nothing: where init
    does not reap orphans, as in some containers, a killed process stays one)."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) <= 19 or fields[0] == b"Z":
        return None
    return fields[19].decode()


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped."""
    fields = _stat_fields(pid)
    return fields is not None and fields[:1] == [b"Z"]


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    start: str | None

    @classmethod
    def me(cls) -> Owner:
        return cls.of(os.getpid())

    @classmethod
    def of(cls, pid: int) -> Owner:
        """Process ``pid`` of this host (its start time None if it is gone already)."""
        return cls(host_name(), pid, _process_start_time(pid))

    def to_json(self) -> str:
        return json.dumps({"host": self.host, "pid": self.pid, "start": self.start})

    @classmethod
    def from_json(cls, text: str) -> Owner | None:
        try:
            data = parse_json(text)
            return cls(str(data["host"]), int(data["pid"]), data.get("start"))
        except (ValueError, KeyError, TypeError):
            return None

    def is_alive(self) -> bool | None:
        """True/False for an owner on this host; None when that cannot be known here."""
        if self.host != host_name():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        if self.start is None:  # recorded without one: alive unless it has exited
            return not _zombie(self.pid)
        return _process_start_time(self.pid) == self.start


def _read_small(path: Path) -> tuple[str, os.stat_result]:
    """A lock or owner file's text and ``fstat``, at most 64 KiB (ValueError), opened by
    :func:`ocistage.cache.readback.open_own`: a symlink (ELOOP), a FIFO or a file of somebody
    outside a group-shared cache (ForeignFile) is never read, and the open never waits."""
    fd, st = open_own(path, owners="group")
    try:
        return read_capped(fd, MAX_LOCK_BYTES).decode("utf-8", errors="replace"), st
    finally:
        os.close(fd)


def lock_owner(path: Path) -> Owner | None:
    """The owner recorded on the first line of lock file ``path`` (None: absent, unreadable,
    half-written or not a lock file of ours)."""
    try:
        return Owner.from_json(_read_small(path)[0].partition("\n")[0])
    except (OSError, ValueError, ForeignFile):
        return None


def is_foreign(path: Path) -> bool:
    """Whether ``path`` holds something that is no lock or owner file of ours: a FIFO, a
    symlink, a file of another user (:mod:`ocistage.cache.readback`). Nobody holds a lock
    through it, and nobody can take the lock while it is there."""
    try:
        os.close(open_own(path, owners="group")[0])
    except ForeignFile:
        return True
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


#: how often a waiting :meth:`FileLock.acquire` judges whether the holder is gone
JUDGE_EVERY = 2.0


def owner_is_dead(path: Path, stale_after: float = STALE_AFTER_SECONDS) -> bool:
    """Whether the owner recorded in lock or owner file ``path`` is known to be gone (never
    for something that is not a lock file of ours: it is not ours to judge, or remove)."""
    try:
        text, st = _read_small(path)
        age = time.time() - st.st_mtime
    except FileNotFoundError:
        return True
    except (OSError, ValueError, ForeignFile):  # a symlink, FIFO or huge file planted there
        return False
    # a lock file holds the owner's JSON on its first line (then the holder's token)
    owner = Owner.from_json(text.partition("\n")[0])
    if owner is None:
        # half-written lock file: its creator died between create and write, or is writing now
        return age > stale_after
    alive = owner.is_alive()
    if alive is None:
        return age > stale_after
    return not alive


class FileLock:
    """An exclusive lock file; use as a context manager or with acquire()/release()."""

    def __init__(
        self,
        path: Path,
        *,
        heartbeat: float = HEARTBEAT_SECONDS,
        stale_after: float = STALE_AFTER_SECONDS,
    ) -> None:
        self.path = path
        self.heartbeat = heartbeat
        self.stale_after = stale_after
        self._token = f"{Owner.me().to_json()}\n{uuid.uuid4().hex}\n"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def try_acquire(self) -> bool:
        """Take the lock if it is free or stale; never waits."""
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if not self._break_if_stale():
                    return False
                continue
            except OSError as exc:
                raise StoreError(f"cannot create lock file {self.path}: {exc.strerror}") from exc
            try:
                written = os.write(fd, self._token.encode())
            except OSError as exc:
                # ours alone (O_EXCL): an empty lock file would look half-written, and keep
                # everyone waiting until it is stale
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
                raise StoreError(f"cannot write lock file {self.path}: {exc.strerror}",
                                 "free space on its filesystem (ocistage cache gc makes "
                                 "room even when it is full)" if exc.errno == errno.ENOSPC
                                 else None) from exc
            os.close(fd)
            if written != len(self._token.encode()):
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
                raise StoreError(f"cannot write lock file {self.path}: short write")
            self._start_heartbeat()
            return True
        return False

    def acquire(self, timeout: float | None = None, poll: float = 0.2) -> None:
        """Take the lock, waiting up to ``timeout`` seconds (None: for ever): tried at once
        (a dead holder's lock broken), then again each time :meth:`wait_released` says it
        is free, so a waiter waits, it does not spin (sixteen nodes asking the importer for
        one image)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.try_acquire():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise LockTimeout(f"timed out waiting for lock {self.path}")
            self.wait_released(remaining, poll)

    def wait_released(self, timeout: float | None = None, poll: float = 0.2,
                      brisk: tuple[float, float] = (0.0, 0.0)) -> None:
        """Wait until nobody holds the lock (its file gone, or its holder gone), without
        taking it: one ``lstat`` a ``poll``, the holder judged every :data:`JUDGE_EVERY`
        seconds. For waiters that only need what the holder makes: they all go on at once
        when it is done, instead of taking the lock one after another.

        ``brisk=(seconds, interval)``: poll every ``interval`` for the first ``seconds`` of
        the wait, then every ``poll``. A short hold (a small image's build) is then followed
        within ``interval``, and a long one costs the metadata server no more ``lstat``s
        than ``poll`` allows."""
        started = judged = time.monotonic()
        deadline = None if timeout is None else started + timeout
        brisk_for, brisk_poll = brisk
        while os.path.lexists(self.path):
            now = time.monotonic()
            if now - judged >= JUDGE_EVERY:
                judged = now
                if owner_is_dead(self.path, self.stale_after):
                    return
            if deadline is not None and now > deadline:
                raise LockTimeout(f"timed out waiting for lock {self.path}")
            time.sleep(brisk_poll if now - started < brisk_for else poll)

    def held(self) -> bool:
        try:
            return _read_small(self.path)[0] == self._token
        except (OSError, ValueError, ForeignFile):
            return False

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        # only remove the file if it is still ours (it may have been broken as stale)
        if self.held():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def _break_if_stale(self) -> bool:
        if not owner_is_dead(self.path, self.stale_after):
            return False
        # rename first so that two breakers cannot both delete a fresh lock taken in between
        # 12 hex digits are plenty apart, and keep the name short (a staged NAME's lock,
        # NAME.lock.stale-<hex>, must fit in 255 bytes: ocistage.stagers.target.MAX_NAME)
        grave = self.path.with_name(f"{self.path.name}.stale-{uuid.uuid4().hex[:12]}")
        try:
            os.rename(self.path, grave)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise StoreError(f"cannot break stale lock {self.path}: {exc.strerror}") from exc
            return False
        with contextlib.suppress(OSError):
            grave.unlink()
        return True

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {self.path.name}",
                                        daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
