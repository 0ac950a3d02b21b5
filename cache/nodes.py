"""Which node this process runs on, as Slurm names it: the name node-local leases record.

Inside a job step or batch script it is ``SLURMD_NODENAME`` (several slurmd may share a host,
and a node's Slurm name need not be its host name); elsewhere the host name, which is a node's
Slurm name on most clusters (``NodeName`` defaults to the short host name).
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def this_node(environ: Mapping[str, str] | None = None) -> str:
    """This node's Slurm name inside a job (``SLURMD_NODENAME``), else the host name."""
    env = os.environ if environ is None else environ
    return env.get("SLURMD_NODENAME") or host_name()


def host_name() -> str:
    """This host's name: what ``socket.gethostname()`` returns (both are the kernel's
    ``uname`` node name), without importing ``socket`` into every command that locks or
    leases in the cache and talks to no network."""
    return os.uname().nodename
