"""How many malloc arenas an ``ocistage`` process may use (issue 29.5: peak RSS).

glibc gives each thread that allocates under contention an arena of its own, up to eight per
CPU, and an arena's freed pages are not all handed back. A cold bundle runs download threads,
a decompression thread and the apply thread, each allocating 1 MiB buffers: on the 10 GB /
300k-file zstd image (`--long=27`, goal: the 128 MiB window + 100 MB) the peak RSS was 232 MiB
with glibc's default, 220-226 MiB with two arenas and 211 MiB with one, in times within the
disk's noise (53-60 s; docs/history/performance-log.md, "Issue 29: the last round"). The
threads allocate while they hold the GIL, so they seldom wait for the one arena's lock;
Python's own small objects do not come from it.

The limit must be set before the first thread allocates (glibc fixes the arena count the first
time it needs a new arena), so the command lines call :func:`limit_malloc_arenas` first thing.
A ``MALLOC_ARENA_MAX`` in the environment wins; elsewhere than glibc nothing is done.
"""

from __future__ import annotations

import os

#: arenas for a whole ocistage process: the main thread's, shared by every thread
ARENAS = 1
_M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Ask glibc for at most ``arenas`` malloc arenas; whether the limit was set here."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (or no C library to ask)
        return False
    if not hasattr(libc, "gnu_get_libc_version"):
        return False  # musl's mallopt takes the call and does nothing
    return bool(mallopt(_M_ARENA_MAX, arenas))
