"""The job step that holds images: who it is (a Slurm job's step, or a pin outside a job)
and its leases on them.

A get that fails or is interrupted drops the step's leases it made (:meth:`JobStep.drop_taken`;
a lease of the step that was there before it, an earlier get's, stays). What a get killed
with SIGKILL leaves is the lease of its pull, held by a dead process, which the next importer
command of the user drops (:func:`~ocistage.cache.leases.drop_own_dead`), and the step's
lease, which pyxis's ``release`` after the failed get drops.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
    #: the leases this process made (store root, lease): a failed get drops them
    taken: list[tuple[Path, leases.Lease]] = field(default_factory=list, compare=False,
                                                   repr=False)

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
        if not leases.exists(root, lease.id):
            self.taken.append((root, lease))
        leases.record(root, lease)
        leases.wait_for_gc(root)
        return lease

    def drop_taken(self) -> None:
        """Drop the leases this process made (a get that failed or was interrupted)."""
        while self.taken:
            root, lease = self.taken.pop()
            with contextlib.suppress(OSError):
                leases.release(root, lease.id)

    def release(self, roots: Sequence[Path]) -> int:
        """Drop every lease of this step in the stores at ``roots``; returns how many."""
        return sum(leases.release_named(root, self.prefix) for root in roots)
