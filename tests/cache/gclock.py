"""A GC lock held by another process, for tests of what waits for a running ``cache gc``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ocistage.cache import leases
from ocistage.cache.leases import GC_LOCK


@contextmanager
def gc_lock_held(cache_root: Path) -> Iterator[Callable[[], None]]:
    """Hold ``cache_root``'s GC lock in a child process; yields a function that releases it.

    The lock is taken (the child said so) when the block starts; the child is killed at the end.
    """
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from ocistage.cache.locks import FileLock
        lock = FileLock(Path({str(cache_root / GC_LOCK)!r}), heartbeat=0.5)
        lock.acquire()
        print("locked", flush=True)
        sys.stdin.readline()
        lock.release()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdin is not None
    stdin = holder.stdin

    def release() -> None:
        stdin.write("\n")
        stdin.flush()

    try:
        assert holder.stdout.readline().strip() == "locked"
        yield release
    finally:
        holder.kill()
        holder.wait()


class GcChecks:
    """Every answer of :func:`ocistage.cache.leases.gc_running` in this process, in order, so a
    test can wait (with a deadline) for something to have *found* a GC running and to be
    waiting for it, instead of sleeping and seeing that nothing happened yet."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers: list[bool] = []
        self._changed = threading.Condition()
        real = leases.gc_running

        def gc_running(cache_root: Path) -> bool:
            answer = real(cache_root)
            with self._changed:
                self.answers.append(answer)
                self._changed.notify_all()
            return answer

        monkeypatch.setattr(leases, "gc_running", gc_running)

    def wait_until_waiting(self, checks: int = 2, timeout: float = 10.0) -> None:
        """Return once ``checks`` checks found the GC running (whoever waits for it polls);
        fail after ``timeout`` seconds."""
        with self._changed:
            assert self._changed.wait_for(lambda: self.answers.count(True) >= checks, timeout), (
                f"nothing found the GC running {checks} times within {timeout} s: "
                f"{self.answers}")
