"""The command lines' malloc arena limit (ocistage.bundler.cli.memory): counted with glibc's
own ``malloc_stats()`` in a fresh interpreter whose threads allocate, with and without it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from ocistage.bundler.cli.memory import ARENAS, limit_malloc_arenas

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")

_PROBE = """
import ctypes, sys, threading
from ocistage.bundler.cli.memory import limit_malloc_arenas
if sys.argv[1] == "limit":
    print(limit_malloc_arenas(), flush=True)
hold = []
together = threading.Barrier(8)  # all alive at once: an exited thread's arena is reused
def allocate():
    together.wait()
    hold.extend(bytearray(64 << 10) for _ in range(8))  # not pymalloc's: glibc's malloc
    together.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL(None).malloc_stats()  # "Arena N:" per arena, on stderr
"""


def _arenas(mode: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], env=env, capture_output=True,
                          text=True, check=True, timeout=60)
    return done.stdout.strip(), sum(line.startswith("Arena ") for line in
                                    done.stderr.splitlines())


def test_threads_share_at_most_the_limit_of_arenas() -> None:
    said, limited = _arenas("limit")
    assert said == "True"
    assert 1 <= limited <= ARENAS
    _, unlimited = _arenas("default")
    assert unlimited > ARENAS  # the probe can see the difference


def test_an_arena_limit_in_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False
