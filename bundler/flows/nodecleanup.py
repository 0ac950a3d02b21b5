"""After ``stage --all-nodes`` in a job: each node's copy removed on that node when the job ends.

The copies are node-local, held by the job's lease (each recording its node,
:mod:`ocistage.cache.leases`). One cleanup job per node is queued
(:func:`ocistage.runtimes.cleanupjob.queue_unstage_jobs`: ``sbatch
--dependency=afterany:JOB --nodelist=NODE``, one task, five minutes) that runs ``ocistage
unstage --missing-ok`` of that node's copy as the job, so the copy goes when the job has ended
in any way, with nobody logged in, and stays while another live job holds it. With ``--pin``
the copies are the pin's, kept until ``unstage --pin``: nothing is queued. A node whose cleanup
job cannot be queued is a warning; its copy then waits for a ``cache gc`` on that node.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ocistage.cache.notice import Kind, Notice

if TYPE_CHECKING:
    from ocistage.stagers.allnodes import NodeResult


def queue_node_cleanups(results: list[NodeResult], cache_root: Path) -> tuple[Notice, ...]:
    """Queue the cleanup job of each node's copy in ``results`` (see the module docstring);
    each node's result gains ``cleanup_job_id`` (None if none was queued). Warnings for the
    nodes left without one."""
    from ocistage.runtimes.cleanupjob import queue_unstage_jobs

    job_id = os.environ.get("SLURM_JOB_ID", "")
    copies = {r.node: Path(str(r.result["path"])) for r in results if r.result.get("path")}
    if not job_id or not copies:
        return ()
    queued = {c.node: c for c in queue_unstage_jobs(copies, job_id=job_id,
                                                    cache_root=cache_root.absolute())}
    notices = []
    for result in results:
        cleanup = queued.get(result.node)
        result.result["cleanup_job_id"] = cleanup.job_id if cleanup else None
        if cleanup is not None and cleanup.error is not None:
            notices.append(Notice(Kind.OTHER, f"{result.node}: no cleanup job for "
                                              f"{copies[result.node]} ({cleanup.error}); it "
                                              f"stays after job {job_id} until a `cache gc` or "
                                              f"`unstage` on that node"))
    return tuple(notices)
