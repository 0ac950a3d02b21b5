"""How many CPUs this process may use (its affinity mask, which Slurm's cgroups and
``taskset`` narrow), for sizing worker pools."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs in this process's affinity mask (``os.cpu_count()`` where it cannot be read)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
