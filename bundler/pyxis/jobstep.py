"""The job step that holds images: who it is (a Slurm job's step, or a pin outside a job)
and its leases on them."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache import leases
from ocistage.cache.pyxisimages import squashfs_target

LEASE_PREFIX = "pyxis-"


@dataclass(frozen=True)
class JobStep:
    """Who holds an image: the Slurm job and step of the environment, or no job (a pin that
    ``release`` in a shell without SLURM_JOB_ID drops)."""

    job_id: str | None
    step_id: str

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> JobStep:
        job = environ.get("SLURM_JOB_ID") or None
        step = environ.get("SLURM_STEP_ID") or "none"
        if not re.fullmatch(r"[A-Za-z0-9_+-]{1,40}", step):
            step = "none"
        return cls(job, step)

    @property
    def prefix(self) -> str:
        """What the ids of this step's leases start with."""
        return f"{LEASE_PREFIX}{self.job_id or 'nojob'}.{self.step_id}-"

    def holder(self) -> leases.Holder:
        if self.job_id is None:
            return leases.Holder.pin(f"pyxis {os.getuid()}")
        return leases.Holder.slurm_job(self.job_id)

    def hold(self, root: Path, key: str) -> leases.Lease:
        """Record this step's lease on image ``key`` in the store at ``root`` (one per step
        and image: a repeated get rewrites it), then wait for a running GC, so that the image
        is looked at only once no GC can take it."""
        lease = leases.Lease(id=f"{self.prefix}{key[:32]}", target=squashfs_target(key),
                             holder=self.holder(), created=time.time())
        leases.record(root, lease)
        leases.wait_for_gc(root)
        return lease

    def release(self, roots: Sequence[Path]) -> int:
        """Drop every lease of this step in the stores at ``roots``; returns how many."""
        return sum(leases.release_named(root, self.prefix) for root in roots)
