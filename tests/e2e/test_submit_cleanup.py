"""`ocistage submit REF -N3 ... -- CMD` on the three-node Slurm
test clusters (24.05, 26.05): the staged
bundle is removed by itself once the job has ended (its afterany cleanup job), when the job
completes and when it is cancelled with scancel, after the submitting command has long exited;
and it stays while another live job holds the same staged bundle."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ocistage.cache.leases import all_leases
from pytest_ocistage.images import ImageRef
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner

pytestmark = pytest.mark.timeout(900)
#: a job that runs until cancelled: PID 1 of the container handles SIGTERM (else it ignores
#: it, and a cancelled job can leave it running: docs/slurm.md, Known limits) and ends anyway
LONG = ("/bin/sh", "-c", "trap 'exit 143' TERM; sleep 120 & wait")
#: the requirement: gone within a minute of the job's end
REMOVAL_DEADLINE = 60.0


def _submit(cluster: SlurmCluster, ocistage: OcistageRunner, image: ImageRef, stage_to: Path,
            output: Path, *command: str, nodes: int = 3) -> dict[str, str]:
    result = ocistage("submit", image.ref, "--stage-to", str(stage_to), "--json", f"-N{nodes}",
                      "--time=5", f"--output={output}", "--", *command,
                      env=cluster.env, check=True)  # returns at once: the shell goes away
    doc: dict[str, str] = json.loads(result.stdout)
    assert doc["job_id"].isdigit() and doc["cleanup_job_id"].isdigit(), doc
    return doc


def _wait_removed(cluster: SlurmCluster, staged: Path, job_id: str) -> None:
    """Poll until the staged bundle is gone; fail if it is still there a minute after the
    job's end."""
    cluster.wait_for_job(job_id, timeout=300)
    deadline = time.monotonic() + REMOVAL_DEADLINE
    while staged.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not staged.exists(), f"{staged} still there {REMOVAL_DEADLINE:.0f}s after the job"


def test_staged_bundle_is_removed_after_the_job_completes(
        slurm_nodes: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path) -> None:
    output = shared_dir / "job.out"
    doc = _submit(slurm_nodes, ocistage, images["busybox"], shared_dir / "staged", output,
                  "/bin/sh", "-c", "grep ^NAME= /etc/os-release; echo nodes=$SLURM_JOB_NUM_NODES")
    staged = Path(doc["staged"])
    assert staged.parent == shared_dir / "staged"
    _wait_removed(slurm_nodes, staged, doc["job_id"])
    assert "nodes=3" in output.read_text().splitlines()
    assert slurm_nodes.wait_for_job(doc["cleanup_job_id"])["JobState"] == "COMPLETED"
    assert [lease for lease in all_leases(ocistage.cache)
            if lease.holder.kind == "slurm-job"] == []


def test_staged_bundle_is_removed_after_scancel(
        slurm_nodes: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path) -> None:
    doc = _submit(slurm_nodes, ocistage, images["busybox"], shared_dir / "staged",
                  shared_dir / "job.out", *LONG)
    job_id = doc["job_id"]
    deadline = time.monotonic() + 120
    while slurm_nodes.job_record(job_id).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, slurm_nodes.job_record(job_id)
        time.sleep(0.3)
    assert Path(doc["staged"]).is_dir()
    slurm_nodes.run("scancel", job_id, check=True)
    _wait_removed(slurm_nodes, Path(doc["staged"]), job_id)
    assert slurm_nodes.job_record(job_id).get("JobState") == "CANCELLED"


def test_a_bundle_shared_with_a_live_job_stays_until_that_job_ends(
        slurm_nodes: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path) -> None:
    stage_to = shared_dir / "staged"
    long = _submit(slurm_nodes, ocistage, images["busybox"], stage_to, shared_dir / "a.out",
                   *LONG, nodes=1)
    short = _submit(slurm_nodes, ocistage, images["busybox"], stage_to, shared_dir / "b.out",
                    "/bin/true", nodes=1)
    assert long["staged"] == short["staged"]  # jobs of one image share one staged copy
    slurm_nodes.wait_for_job(short["job_id"], timeout=300)
    assert slurm_nodes.wait_for_job(short["cleanup_job_id"])["JobState"] == "COMPLETED"
    assert Path(long["staged"]).is_dir()  # the long job still holds it
    slurm_nodes.run("scancel", long["job_id"], check=True)
    _wait_removed(slurm_nodes, Path(long["staged"]), long["job_id"])
