"""Failing instead of hanging: a test that guards against a blocking ``open`` (of a FIFO) runs
the code under :func:`deadline`, whose SIGALRM interrupts the open; a test that waits for a
condition polls it with :func:`wait_until`."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


class Hung(BaseException):
    """Not an OSError (TimeoutError is one, which the code under test may swallow)."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`Hung` in the main thread if the body takes longer than ``seconds``."""
    def expire(signum: int, frame: FrameType | None) -> None:
        raise Hung(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def wait_until(condition: Callable[[], object], what: str, seconds: float = 120.0) -> object:
    """Poll ``condition`` until it is true (returned) or ``seconds`` have passed (failed)."""
    end = time.monotonic() + seconds
    while not (value := condition()):
        if time.monotonic() > end:
            raise AssertionError(f"{what} after {seconds} s")
        time.sleep(0.01)
    return value
