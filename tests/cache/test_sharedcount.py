"""cache/sharedcount.py: a count that threads and forked processes add to, none of them lost."""

from __future__ import annotations

import os
import signal
import threading
import time

from ocistage.cache.sharedcount import SharedCount


def _forked(count: SharedCount, times: int) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            for _ in range(times):
                count.add(1)
            code = 0
        finally:
            os._exit(code)
    return pid


def _exit_code(pid: int, timeout: float = 30.0) -> int:
    """The child's exit code; killed (and the test failed) if it is stuck."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"the child {pid} was stuck")


def test_forked_processes_add_to_one_count() -> None:
    count = SharedCount()
    pids = [_forked(count, 2000) for _ in range(4)]
    for _ in range(2000):
        count.add(1)
    for pid in pids:
        assert _exit_code(pid) == 0
    assert count.value == 5 * 2000


def test_threads_add_to_one_count() -> None:
    count = SharedCount()
    threads = [threading.Thread(target=lambda: [count.add(2) for _ in range(5000)])
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert count.value == 4 * 5000 * 2


def test_a_child_forked_while_a_thread_adds_is_not_stuck() -> None:
    """The thread lock a fork copies may be held by a thread that the child does not have:
    the child makes its own."""
    count = SharedCount()
    count._lock.acquire()  # as if another thread were adding at the fork
    try:
        pid = _forked(count, 10)
    finally:
        count._lock.release()
    assert _exit_code(pid) == 0
    assert count.value == 10


def test_negative_amounts_and_a_fresh_count() -> None:
    count = SharedCount()
    assert count.value == 0
    count.add(-3)
    assert count.value == -3
