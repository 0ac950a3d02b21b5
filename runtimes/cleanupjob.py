"""The cleanup job queued from inside a job: ``sbatch --dependency=afterany:JOB`` as the user.

A job's own leftovers (a staged bundle on a shared or a node-local disk) must go when the job
ends in any way: completed, failed, timed out or ``scancel``led. Cleanup inside the job dies
with it, a job epilog is the site's, and ``strigger`` programs run on the controller host; so
the job queues, as its user, a one-task job that Slurm starts once the job has ended, pinned to
the node that holds a node-local copy (docs/slurm.md, "Removal after the job, by itself").
``ocistage scrun stage-in`` (:mod:`ocistage.runtimes.scrun_cleanup`) and ``ocistage stage
--all-nodes`` (:func:`queue_unstage_jobs`, one per node) queue theirs here; ``ocistage submit``
queues its own from outside the job with the same options (:func:`ocistage.runtimes.submit.
cleanup_options`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ocistage.errors import OcistageError
from ocistage.runtimes.slurm import sbatch
from ocistage.runtimes.submit import cleanup_options, this_ocistage, unstage_command, wrap_command

#: the job's own placement, as an srun or allocation environment gives it
_PLACEMENT_ENV = {"SLURM_JOB_PARTITION": "--partition", "SLURM_JOB_ACCOUNT": "--account",
                  "SLURM_JOB_QOS": "--qos", "SLURM_JOB_RESERVATION": "--reservation"}


def submit_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without what would make sbatch, run inside a job step, inherit the step's
    shape (``SLURM_NNODES``, ``SBATCH_*``, ...); ``SLURM_CONF`` stays."""
    return {key: value for key, value in environ.items()
            if key == "SLURM_CONF" or not key.startswith(("SLURM_", "SBATCH_", "SALLOC_",
                                                          "SRUN_"))}


def cleanup_job_options(job_id: str, *, node: str | None, environ: Mapping[str, str],
                        name: str = "ocistage-scrun-unstage") -> list[str]:
    """sbatch options of the cleanup job: after ``job_id`` whatever its end, in the job's
    partition/account/qos, on ``node`` (the one holding a node-local bundle) when given."""
    placement = [f"{option}={environ[key]}" for key, option in _PLACEMENT_ENV.items()
                 if environ.get(key)]
    options = cleanup_options(placement, job_id, name=name)
    if node:
        options.append(f"--nodelist={node}")
    return options


@dataclass(frozen=True)
class NodeCleanup:
    """The cleanup job queued for one node's copy, or why there is none."""

    node: str
    job_id: str | None
    error: str | None = None


def queue_unstage_jobs(copies: Mapping[str, Path], *, job_id: str, cache_root: Path,
                       environ: Mapping[str, str] | None = None, sbatch_program: str = "sbatch",
                       ocistage: Sequence[str] | None = None) -> list[NodeCleanup]:
    """For each node and the path of its copy in ``copies``, queue a cleanup job pinned to
    that node that runs ``ocistage unstage`` of it as job ``job_id`` (releasing that job's
    lease; the copy stays while another live lease holds it). Best effort: a node whose job
    cannot be queued says why, the others are queued."""
    environ = os.environ if environ is None else environ
    env = submit_env(environ)
    prefix = tuple(ocistage or this_ocistage())
    queued = []
    for node, path in sorted(copies.items()):
        command = unstage_command(prefix, path, job_id, cache_root)
        options = cleanup_job_options(job_id, node=node, environ=environ,
                                      name="ocistage-unstage")
        try:
            queued.append(NodeCleanup(node, sbatch(options, container=None,
                                                   wrap=wrap_command(command), env=env,
                                                   program=sbatch_program)))
        except OcistageError as exc:
            queued.append(NodeCleanup(node, None, exc.message))
    return queued
