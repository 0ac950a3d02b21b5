"""The watchdog's rules, and that tripping a transfer unblocks a thread stuck in ``recv``
(a real socket pair; the end-to-end cases are in tests/e2e/test_slow_servers.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from ocistage.bundler.registry.watchdog import CANCELLED, Limits, Transfer, Watchdog


def test_the_deadline_rule() -> None:
    transfer = Transfer(Limits(deadline=10), started=100.0)
    assert transfer.check(109.0) is None
    assert transfer.check(111.0) == "took longer than 10 s"


def test_the_speed_rule_counts_per_window_and_not_while_paused() -> None:
    transfer = Transfer(Limits(min_speed=100, window=2), started=0.0)
    transfer.advance(500)
    assert transfer.check(1.0) is None        # the window is not over yet
    assert transfer.check(2.0) is None        # 500 bytes in 2 s: 250 B/s
    transfer.advance(150)
    reason = transfer.check(4.0)              # 150 bytes in the next 2 s: 75 B/s
    assert reason is not None and "slower than 100 B/s for 2 s" in reason
    idle = Transfer(Limits(min_speed=100, window=2), started=0.0)
    with idle.paused_while():                 # the consumer holds the data: not a stall
        assert idle.check(10.0) is None
    assert idle.check(11.0) is None           # the window starts again after the pause


@pytest.fixture
def wired() -> Iterator[tuple[Watchdog, socket.socket, socket.socket]]:
    """A watchdog and a connected socket pair (ours is watched, theirs is the server)."""
    watchdog = Watchdog()
    ours, theirs = socket.socketpair()
    try:
        yield watchdog, ours, theirs
    finally:
        watchdog.close()
        ours.close()
        theirs.close()


def test_cancel_unblocks_a_thread_waiting_in_recv(
        wired: tuple[Watchdog, socket.socket, socket.socket]) -> None:
    watchdog, ours, _ = wired
    outcome: list[bytes] = []
    with watchdog.watching(Limits(), ours) as transfer:
        reader = threading.Thread(target=lambda: outcome.append(ours.recv(10)))
        reader.start()
        watchdog.cancel()
        reader.join(timeout=30)
        assert not reader.is_alive()
    assert outcome == [b""] and transfer.reason == CANCELLED
    assert not watchdog.pause(0.01)  # cancelled: pauses end at once
    with watchdog.watching(Limits()) as later:
        assert later.cancelled        # and new transfers start cancelled


def test_the_thread_trips_a_stalled_transfer(
        wired: tuple[Watchdog, socket.socket, socket.socket]) -> None:
    watchdog, ours, _ = wired
    with watchdog.watching(Limits(deadline=0.3), ours) as transfer:
        assert ours.recv(10) == b""  # returns once the watchdog shuts the socket down
    assert transfer.reason == "took longer than 0.3 s"


def test_a_finished_transfer_is_never_tripped(
        wired: tuple[Watchdog, socket.socket, socket.socket]) -> None:
    """Its socket may be back in the pool serving another request: it must not be shut."""
    watchdog, ours, theirs = wired
    with watchdog.watching(Limits(), ours) as transfer:
        pass
    transfer.trip("took longer than 1 s")  # the watchdog thread, a moment too late
    theirs.sendall(b"still open")
    assert ours.recv(10) == b"still open" and transfer.reason is None
