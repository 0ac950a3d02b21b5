"""A GC lock held by another process, for tests of what waits for a running ``cache gc``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

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
