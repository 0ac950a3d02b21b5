"""The detached removers a test's stages started (:mod:`ocistage.stagers.remover`), found by
their leases in the test's cache: :func:`settle` waits for them with a deadline and kills what
is left by the session each made (its pid: the remover is its session's leader), so no test
leaves one behind. The autouse fixture of ``tests/conftest.py`` (``stray_removers``) is
the safety net for stages whose cache a test does not name: removers of this interpreter
whose environment says they were started by the current test."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ocistage.cache import leases
from ocistage.stagers.detach import REMOVER_MODULE
from ocistage.stagers.retired import is_remover
from tests.procs import running

#: how long a remover of a test's small tree may take on a busy machine
SETTLE_SECONDS = 60.0


def remover_pids(cache_root: Path) -> list[int]:
    """The running removers holding a lease in ``cache_root``."""
    found = []
    for lease in leases.all_leases(cache_root):
        pid = lease.holder.pid
        if is_remover(lease) and pid is not None and leases.is_live(lease, {}) and running(pid):
            found.append(pid)
    return found


def settle(cache_root: Path, timeout: float = SETTLE_SECONDS) -> None:
    """Wait until the removers of ``cache_root`` are done (:func:`reap`)."""
    reap(lambda: remover_pids(cache_root), timeout)


def reap(find: Callable[[], list[int]], timeout: float = SETTLE_SECONDS) -> None:
    """Poll ``find()`` (the pids of removers) until it is empty; after ``timeout`` kill their
    sessions and fail."""
    end = time.monotonic() + timeout
    while pids := find():
        if time.monotonic() > end:
            for pid in pids:
                kill_session(pid, signal.SIGKILL)
            raise AssertionError(f"removers {pids} still ran after {timeout} s; killed")
        time.sleep(0.01)


def kill_session(pid: int, signum: int) -> None:
    """Send ``signum`` to the session the remover ``pid`` made (its process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


def wait_gone(pid: int, timeout: float = SETTLE_SECONDS) -> None:
    """Wait until process ``pid`` has ended (reaped by whoever its parent is now)."""
    end = time.monotonic() + timeout
    while running(pid):
        assert time.monotonic() < end, f"process {pid} still runs after {timeout} s"
        time.sleep(0.005)


def removers_of_test(nodeid: str) -> list[int]:
    """Removers run by this interpreter whose environment names the test ``nodeid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if argv[:3] != [sys.executable.encode(), b"-m", REMOVER_MODULE.encode()]:
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        current = [v for v in environ if v.startswith(b"PYTEST_CURRENT_TEST=")]
        if current and current[0].decode(errors="replace").partition("=")[2].startswith(
                nodeid + " ") and running(int(entry)):
            found.append(int(entry))
    return found


def settle_homes(homes: Path, timeout: float = SETTLE_SECONDS) -> None:
    """:func:`settle` the cache of every user's home under ``homes`` (tests/cotenant.py)."""
    caches = [home / "cache" for home in sorted(homes.iterdir()) if (home / "cache").is_dir()]
    reap(lambda: [pid for cache in caches for pid in remover_pids(cache)], timeout)


def session_members(sid: int) -> list[int]:
    """The running processes of session ``sid`` (a remover and its forked workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry))
    return found
