"""FileLock.wait_released's polling: brisk for a while, then every ``poll``.

The clock is this test's (the locks module's ``time``: ``monotonic`` advanced by what is
slept), so the schedule is checked exactly; the lock is a real one held by this
process, released by the clock after a set time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from ocistage.cache import locks
from ocistage.cache.locks import FileLock


class _Clock:
    def __init__(self, holder: FileLock, release_at: float) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self._holder = holder
        self._release_at = 1000.0 + release_at

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.now >= self._release_at and self._holder.held():
            self._holder.release()


@pytest.fixture
def held(tmp_path: Path) -> Iterator[FileLock]:
    holder = FileLock(tmp_path / "image.lock")
    assert holder.try_acquire()
    yield holder
    holder.release()


def _wait(monkeypatch: pytest.MonkeyPatch, holder: FileLock, release_at: float,
          **kwargs: object) -> list[float]:
    clock = _Clock(holder, release_at)
    monkeypatch.setattr(locks, "time", SimpleNamespace(monotonic=clock.monotonic,
                                                       sleep=clock.sleep, time=time.time))
    FileLock(holder.path).wait_released(**kwargs)  # type: ignore[arg-type]
    monkeypatch.undo()
    return clock.slept


def test_a_short_hold_is_followed_within_the_brisk_interval(
        monkeypatch: pytest.MonkeyPatch, held: FileLock) -> None:
    slept = _wait(monkeypatch, held, 0.35, poll=0.2, brisk=(3.0, 0.02))
    assert set(slept) == {0.02}
    assert 0.35 <= sum(slept) < 0.35 + 0.02 + 1e-9


def test_a_long_hold_goes_back_to_the_slow_poll(
        monkeypatch: pytest.MonkeyPatch, held: FileLock) -> None:
    slept = _wait(monkeypatch, held, 10.0, poll=0.2, brisk=(3.0, 0.02))
    brisk = [s for s in slept if s == 0.02]
    slow = [s for s in slept if s == 0.2]
    assert len(brisk) + len(slow) == len(slept)
    assert sum(brisk) == pytest.approx(3.0, abs=0.03)
    assert slow and slept.index(0.2) == len(brisk)  # brisk first, then only slow


def test_without_brisk_every_poll_is_the_same(
        monkeypatch: pytest.MonkeyPatch, held: FileLock) -> None:
    slept = _wait(monkeypatch, held, 1.0, poll=0.2)
    assert set(slept) == {0.2}
