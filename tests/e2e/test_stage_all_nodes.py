"""`ocistage stage --all-nodes REF --to NODE_LOCAL` on the three-node Slurm
test clusters (24.05, 26.05)
(``slurm_nodes``: nodes n1-n3 on this host, each slurmd in its own mount namespace where the
node-local directory is a private bind mount). The registry is reached through a logging proxy
(pytest_ocistage/faultproxy.py, no faults armed) so the test counts what the whole job asked for.
The jobs wait, once staged, until the test has looked at the nodes' copies: when a job ends,
its cleanup jobs remove them (tests/e2e/test_stage_all_nodes_cleanup.py), and each test waits
for that before it ends.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from pathlib import Path

import pytest

from ocistage.cache.leases import all_leases
from pytest_ocistage.faultproxy import FaultProxy
from pytest_ocistage.images import ImageRef
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner

pytestmark = pytest.mark.timeout(900)


def _stage_command(ocistage: OcistageRunner, ref: str, to: Path, out: Path, name: str) -> str:
    """Stage on every node, write the JSON result to ``out`` (all at once, when done), then
    wait for ``out.go`` (:func:`_looked_at`)."""
    # the default (links where possible): the node-local bind mounts share /tmp's filesystem
    # with the cache, so link() fails with EXDEV and the stagers fall back to copies
    command = shlex.join([*ocistage.command, "stage", "--all-nodes", ref, "--to", str(to),
                          "--name", name, "--json"])
    partial, go = shlex.quote(f"{out}.partial"), shlex.quote(f"{out}.go")
    return (f"{command} > {partial} && mv {partial} {shlex.quote(str(out))} && "
            f"while [ ! -e {go} ]; do sleep 0.2; done")


def _wait_for_stage(out: Path, finished: threading.Event | None = None) -> None:
    deadline = time.monotonic() + 600
    while not out.exists():
        assert time.monotonic() < deadline and not (finished and finished.is_set()), out
        time.sleep(0.3)


def _looked_at(cluster: SlurmCluster, out: Path, name: str) -> None:
    """Once the job has been let go: wait until its cleanup jobs removed every node's copy."""
    deadline = time.monotonic() + 120
    while any((cluster.node_dir(node) / name).exists() for node in cluster.nodes):
        assert time.monotonic() < deadline, f"{name} not removed after the job"
        time.sleep(0.3)


def _check_every_node_staged(cluster: SlurmCluster, out: Path, job_id: str,
                             ocistage: OcistageRunner, name: str) -> None:
    results = json.loads(out.read_text())
    assert [r["node"] for r in results] == ["n1", "n2", "n3"]  # SLURMD_NODENAME, not the host
    for result in results:
        assert result["path"] == str(cluster.node_local / name)
        mine = cluster.node_dir(result["node"]) / name
        assert (mine / "rootfs" / "bin" / "busybox").is_file(), result
        assert (mine / "config.json").is_file()
    # the host's view of the node-local path is its own (empty): the bundles are the nodes'
    assert not (cluster.node_local / name).exists()
    holders = {(lease.holder.kind, lease.holder.job_id, lease.node)
               for lease in all_leases(ocistage.cache) if lease.holder.kind == "slurm-job"}
    assert holders == {("slurm-job", job_id, node) for node in ("n1", "n2", "n3")}


def _check_one_request_per_thing(proxy: FaultProxy, image: ImageRef) -> None:
    assert proxy.count(rf"/v2/{image.repository}/manifests/") == 1
    for digest in (image.config_digest, *image.layer_digests):
        assert proxy.count(rf"/v2/{image.repository}/blobs/{digest}") == 1, digest


def test_inside_salloc_each_node_gets_its_own_bundle_from_one_fetch(
        slurm_nodes: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        fault_proxy: FaultProxy, shared_dir: Path) -> None:
    image = images["busybox"]
    ref = image.via(fault_proxy.host)
    out = shared_dir / "salloc.json"
    script = _stage_command(ocistage, ref, slurm_nodes.node_local, out, "salloc-app")
    done = threading.Event()
    outcome: list[object] = []

    def salloc() -> None:
        try:
            outcome.append(slurm_nodes.salloc(
                "-N3", "sh", "-c", f"echo $SLURM_JOB_ID > {shlex.quote(f'{out}.job')} && "
                                   f"{script}", env=ocistage.environment(), cwd=shared_dir,
                timeout=600))
        finally:
            done.set()

    thread = threading.Thread(target=salloc)
    thread.start()
    try:
        _wait_for_stage(out, done)
        job_id = Path(f"{out}.job").read_text().strip()
        _check_every_node_staged(slurm_nodes, out, job_id, ocistage, "salloc-app")
    finally:
        Path(f"{out}.go").touch()
        thread.join()
    [result] = outcome
    assert getattr(result, "returncode", None) == 0, result
    _looked_at(slurm_nodes, out, "salloc-app")
    _check_one_request_per_thing(fault_proxy, image)


def test_inside_an_sbatch_script_each_node_gets_its_own_bundle_from_one_fetch(
        slurm_nodes: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        fault_proxy: FaultProxy, shared_dir: Path) -> None:
    image = images["multilayer"]
    ref = image.via(fault_proxy.host)
    out = shared_dir / "sbatch.json"
    script = shared_dir / "job.sh"
    script.write_text("#!/bin/sh\nset -e\n"
                      + _stage_command(ocistage, ref, slurm_nodes.node_local, out,
                                       "sbatch-app") + "\n")
    script.chmod(0o755)
    job_id = slurm_nodes.sbatch("-N3", f"--output={shared_dir}/job.out", str(script),
                                env=ocistage.environment(), cwd=shared_dir)
    try:
        _wait_for_stage(out)
        _check_every_node_staged(slurm_nodes, out, job_id, ocistage, "sbatch-app")
    finally:
        Path(f"{out}.go").touch()
    record = slurm_nodes.wait_for_job(job_id, timeout=600)
    log = (shared_dir / "job.out").read_text() if (shared_dir / "job.out").exists() else ""
    assert record.get("JobState") == "COMPLETED", (record, log)
    _looked_at(slurm_nodes, out, "sbatch-app")
    _check_one_request_per_thing(fault_proxy, image)


def test_inside_a_step_of_several_tasks_it_is_refused_before_any_request(
        slurm_nodes: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        fault_proxy: FaultProxy, shared_dir: Path) -> None:
    ref = images["busybox"].via(fault_proxy.host)
    before = {node: sorted(slurm_nodes.node_dir(node).iterdir()) for node in slurm_nodes.nodes}
    result = slurm_nodes.srun("-N3", *ocistage.command, "stage", "--all-nodes", ref, "--to",
                              str(slurm_nodes.node_local), env=ocistage.environment(),
                              cwd=shared_dir, timeout=600)
    assert result.returncode != 0
    assert result.stderr.count("error: --all-nodes inside a job step of 3 tasks") == 3, \
        result.stderr
    assert "not under srun" in result.stderr
    assert fault_proxy.requests == []
    assert {node: sorted(slurm_nodes.node_dir(node).iterdir())
            for node in slurm_nodes.nodes} == before
