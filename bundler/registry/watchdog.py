"""A download watchdog: an overall deadline and a minimum throughput for each HTTP exchange.

A socket read timeout alone does not bound a request: a server that trickles one byte every
20 s never lets a read time out. The transport registers each exchange it is waiting on (the
response headers, a document body, a blob body) as a :class:`Transfer`; one thread per
:class:`Watchdog` looks at them a few times a second and, when one is past its deadline or has
received less than ``min_speed`` bytes a second over a ``window`` of seconds (curl's
``--speed-limit``/``--speed-time``, git's ``http.lowSpeedLimit``/``lowSpeedTime``), shuts its
socket down. The thread blocked in ``recv`` then returns at once, and the transport reports the
transfer's :attr:`Transfer.reason` instead of the bare socket error.

:meth:`Watchdog.cancel` trips every transfer in flight the same way (Ctrl-C: stop now, keep
what has arrived) and makes :meth:`Watchdog.pause` return early.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

CANCELLED = "cancelled"
TICK = 0.25  # seconds between looks: a cancelled transfer stops within this


@dataclass(frozen=True)
class Limits:
    """What a transfer must achieve; ``None`` switches a rule off."""

    deadline: float | None = None   # seconds for the whole exchange
    min_speed: float | None = None  # bytes a second, averaged over ``window``
    window: float = 30.0


@dataclass(eq=False)
class Transfer:
    """One exchange being watched; the reading thread adds to :attr:`received`."""

    limits: Limits
    started: float
    sock: socket.socket | None = None
    received: int = 0
    reason: str | None = None
    paused: bool = False
    done: bool = False   # the exchange is over: its socket may serve another one now
    _window_start: float = 0.0
    _window_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self.sock = sock
            if self.reason is not None and not self.done:
                _shut(sock)

    def advance(self, n: int) -> None:
        self.received += n

    @contextmanager
    def paused_while(self) -> Iterator[None]:
        """Not watched for speed while the consumer holds the data (a slow disk is no stall)."""
        self.paused = True
        try:
            yield
        finally:
            self._window_start, self._window_bytes = time.monotonic(), self.received
            self.paused = False

    @property
    def cancelled(self) -> bool:
        return self.reason == CANCELLED

    def trip(self, reason: str) -> None:
        """Record why the transfer is stopped and unblock its reader (unless it is over)."""
        with self._lock:
            if self.done:
                return
            if self.reason is None:
                self.reason = reason
            if self.sock is not None:
                _shut(self.sock)

    def finish(self) -> None:
        with self._lock:
            self.done = True

    def check(self, now: float) -> str | None:
        """Why the transfer must stop at ``now``, if it must."""
        limits = self.limits
        if limits.deadline is not None and now - self.started > limits.deadline:
            return f"took longer than {limits.deadline:g} s"
        if (limits.min_speed is not None and not self.paused
                and now - self._window_start >= limits.window):
            received = self.received
            if received - self._window_bytes < limits.min_speed * limits.window:
                return (f"slower than {_rate(limits.min_speed)} for {limits.window:g} s "
                        f"({received} bytes received)")
            self._window_start, self._window_bytes = now, received
        return None


def _rate(speed: float) -> str:
    return f"{speed / 1024:g} KiB/s" if speed >= 1024 else f"{speed:g} B/s"


def _shut(sock: socket.socket) -> None:
    # the plain socket's shutdown, also for an SSLSocket: its own would drop the TLS object
    # under the thread that is reading from it
    with suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Watchdog:
    """Watches the transfers of one transport; its thread runs while there are some."""

    def __init__(self) -> None:
        self._transfers: set[Transfer] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._cancelled = threading.Event()
        self._closed = False

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @contextmanager
    def watching(self, limits: Limits, sock: socket.socket | None = None) -> Iterator[Transfer]:
        """Watch one exchange for the duration of the block."""
        transfer = Transfer(limits, time.monotonic(), sock)
        transfer._window_start = transfer.started
        with self._lock:
            if self._cancelled.is_set():
                transfer.reason = CANCELLED
            self._transfers.add(transfer)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
                self._thread.start()
        try:
            yield transfer
        finally:
            transfer.finish()
            with self._lock:
                self._transfers.discard(transfer)

    def cancel(self) -> None:
        """Stop every transfer in flight and refuse new ones (Ctrl-C)."""
        self._cancelled.set()
        with self._lock:
            transfers = list(self._transfers)
        for transfer in transfers:
            transfer.trip(CANCELLED)

    def pause(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; False if cancelled meanwhile."""
        return not self._cancelled.wait(seconds)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            self._wake.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                self._wake.wait(TICK)
                if self._closed:
                    return
                transfers = list(self._transfers)
            now = time.monotonic()
            for transfer in transfers:
                if transfer.reason is None and (reason := transfer.check(now)) is not None:
                    transfer.trip(reason)
