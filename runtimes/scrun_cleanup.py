"""The cleanup job of a bundle that ``ocistage scrun stage-in`` staged.

scrun.lua's stage-out hook is not enough on its own: ``scrun kill`` (``docker kill``, ``podman
stop``) cancels the job before scrun runs stage-out, and for node-local staging stage-out must
then reach the node through ``srun --jobid`` of a job that is gone, so the bundle would stay
(and a killed scrun never runs stage-out at all). So stage-in also queues, as the job user, a
one-task job ``sbatch --dependency=afterany:JOB`` that runs ``ocistage scrun stage-out`` for
that bundle once the job has ended in any way, pinned to the node that holds the bundle when
it is node-local. A stage-out that ran normally cancels it, so the queue is left as it was.
The job's options are :mod:`ocistage.runtimes.cleanupjob`'s, as for ``stage --all-nodes``.

Queueing is best effort: where it fails (no sbatch, a submit limit), stage-in still succeeds,
reports why in its result, and stage-out (or ``ocistage cache gc``) remains the way out.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ocistage.errors import OcistageError
from ocistage.runtimes.cleanupjob import cleanup_job_options, submit_env
from ocistage.runtimes.slurm import cancel_job, sbatch
from ocistage.runtimes.submit import this_ocistage, wrap_command

__all__ = ["cancel_cleanup", "cleanup_job_options", "queue_cleanup", "stage_out_command",
           "submit_env"]

def stage_out_command(bundle: Path, cache_root: Path,
                      ocistage: Sequence[str] | None = None) -> list[str]:
    """What the cleanup job runs: stage-out of ``bundle`` (which releases the job's lease)."""
    return [*(ocistage or this_ocistage()), "scrun", "stage-out", "--bundle", str(bundle),
            "--cache", str(cache_root)]


def queue_cleanup(bundle: Path, *, job_id: str, cache_root: Path, sbatch_program: str,
                  node: str | None, environ: Mapping[str, str] | None = None) -> str:
    """Queue the cleanup job of ``bundle``; returns its id. Raises :class:`SlurmError`."""
    environ = os.environ if environ is None else environ
    command = stage_out_command(bundle, cache_root)
    options = cleanup_job_options(job_id, node=node, environ=environ)
    return sbatch(options, container=None, wrap=wrap_command(command),
                  env=submit_env(environ), program=sbatch_program)


def cancel_cleanup(cleanup_job_id: str, *, sbatch_program: str,
                   environ: Mapping[str, str] | None = None) -> bool:
    """Cancel the cleanup job after a stage-out that ran normally, unless this process *is*
    that job. Best effort (the job then finds nothing to remove); returns whether it ran."""
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_JOB_ID") == cleanup_job_id:
        return False
    scancel = str(Path(sbatch_program).with_name("scancel")) if os.sep in sbatch_program \
        else "scancel"
    with contextlib.suppress(OcistageError, OSError):
        cancel_job(cleanup_job_id, program=scancel, env=submit_env(environ))
        return True
    return False

