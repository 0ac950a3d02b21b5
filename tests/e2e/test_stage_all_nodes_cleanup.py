"""What cleans up the node-local copies of ``ocistage stage --all-nodes`` (docs/site.md, "How
``stage --all-nodes`` copies are cleaned up"; issue 38), on the three-node test clusters
(``slurm_nodes``: each node's node-local directory is private to its slurmd; the host, where
the test runs ``cache gc`` as on a login node, sees its own, empty one):

- nothing, when the job ends: every node keeps its copy; ``cache gc`` on the host then drops
  the dead leases (it cannot reach the nodes' paths) and the copies stay;
- ``ocistage unstage PATH`` on each node, one after the other (``srun -w NODE``), at the end of
  the job script removes every copy, and so does one srun over the nodes with ``--force``;
- a copy whose lease gc dropped is still removed by ``unstage`` on its node.

(One srun running ``unstage`` on all nodes at once kept one node's copy in runs by hand: the
copies share one lease, and the unstages race for it. That is not asserted here.)
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from ocistage.cache.leases import all_leases
from pytest_ocistage.images import ImageRef
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner

pytestmark = pytest.mark.timeout(900)


def _copies(cluster: SlurmCluster, name: str) -> list[str]:
    """The nodes holding a staged copy ``name``."""
    return [node for node in cluster.nodes
            if (cluster.node_dir(node) / name / "rootfs" / "bin" / "busybox").is_file()]


def _job(cluster: SlurmCluster, ocistage: OcistageRunner, shared_dir: Path, script: str) -> str:
    """``script`` as the shell of ``salloc -N3``; the job's id once it has left squeue."""
    result = cluster.salloc("-N3", "sh", "-ec", f"{script}\necho job=$SLURM_JOB_ID",
                            env=ocistage.environment(), cwd=shared_dir, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = result.stdout.strip().rsplit("job=", 1)[-1]
    cluster.wait_until_gone_from_squeue(job_id)
    return job_id


def _staged_leases(ocistage: OcistageRunner, name: str) -> list[str]:
    return [lease.holder.job_id or "" for lease in all_leases(ocistage.cache)
            if lease.target.endswith(f"/{name}") and lease.target.startswith("staged:")]


def test_all_nodes_copies_stay_after_the_job_and_go_with_unstage_on_each_node(
        slurm_nodes: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path) -> None:
    cluster, ref = slurm_nodes, images["busybox"].ref
    command = shlex.join(ocistage.command)

    def stage(name: str) -> str:
        return (f"{command} stage -q --all-nodes {shlex.quote(ref)} --to "
                f"{shlex.quote(str(cluster.node_local))} --name {name} > /dev/null")

    def unstage(name: str) -> str:
        """``ocistage unstage`` of ``name`` on each node, one node after the other (a single
        srun over the nodes races: docs/site.md)."""
        path = shlex.quote(str(cluster.node_local / name))
        # docs/site.md's loop, as written there
        return ('for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do\n'
                f'    srun -w "$node" -N1 -n1 {command} unstage {path}\n'
                'done')

    # a job that only stages: its copies outlive it, and gc on the host does not reach them
    job_id = _job(cluster, ocistage, shared_dir, stage("left"))
    assert _copies(cluster, "left") == list(cluster.nodes)
    # held by the job, one path for three places: the nodes' stagers share a lease or make
    # their own, as they come (one or two were seen)
    assert set(_staged_leases(ocistage, "left")) == {job_id}
    # as on a login node of the cluster: squeue answers there (without it a job's lease counts
    # as live)
    gc = cluster.run(*ocistage.command, "cache", "gc", env=ocistage.environment(), cwd=shared_dir)
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert _copies(cluster, "left") == list(cluster.nodes)
    assert _staged_leases(ocistage, "left") == []

    # a job that unstages on each node at its end leaves nothing
    _job(cluster, ocistage, shared_dir, f"{stage('tidy')}\n{unstage('tidy')}")
    assert _copies(cluster, "tidy") == []
    assert _staged_leases(ocistage, "tidy") == []
    # so does one srun over the nodes with --force
    _job(cluster, ocistage, shared_dir,
         f"{stage('forced')}\nsrun --nodes=3 --ntasks=3 --ntasks-per-node=1 {command} unstage "
         f"--force {shlex.quote(str(cluster.node_local / 'forced'))}")
    assert _copies(cluster, "forced") == []
    assert _staged_leases(ocistage, "forced") == []

    # the copies whose lease gc dropped: unstage on each node still removes them
    _job(cluster, ocistage, shared_dir, unstage("left"))
    assert not any((cluster.node_dir(node) / "left").exists() for node in cluster.nodes)
