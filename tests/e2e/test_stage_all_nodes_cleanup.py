"""Nothing left behind by ``ocistage stage --all-nodes`` (issue 34, item 7), on the three-node
test clusters (``slurm_nodes``: each node's node-local directory is private to its slurmd; the
host, where the test runs ``cache gc`` as on a login node, sees its own, empty one). Everything
runs as an ordinary user this module creates (``ocistage-allnodes``: no sudo, removed at the
end; not the session's ``slurm_job_user``, which other test sessions on the host share):

- an ``sbatch -N3`` job that stages to the node-local directory and ends: every node's copy is
  removed by the job's own cleanup (one afterany job per node), with nobody logged in; a
  ``cache gc`` on the host while the job runs, and one after the job has ended but before the
  cleanup jobs ran (they are held), keeps the job's leases (``left``: the copies are on other
  nodes) instead of dropping them, and the copies still go once the cleanup jobs run;
- the same job ``scancel``led while it runs: the copies go as well;
- ``--pin`` holds the copies past the job (no cleanup job); ``unstage --pin`` on each node
  removes them.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ocistage.images import ImageRef
from pytest_ocistage.jobuser import JobUser, job_user_account
from pytest_ocistage.runner import OcistageRunner
from pytest_ocistage.slurm import SlurmCluster

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.needs_root("a created job user, chown, scontrol hold")]
#: the copies go within this long after the job's end (the cleanup jobs start in seconds)
REMOVAL_DEADLINE = 90.0


class _User:
    """ocistage and Slurm's commands run as ``user`` with a cache of theirs under ``base``."""

    def __init__(self, cluster: SlurmCluster, user: JobUser, base: Path) -> None:
        self.cluster, self.user, self.base = cluster, user, base
        self.runner = OcistageRunner.in_directory(base)
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(base)], check=True)

    @property
    def command(self) -> str:
        """ocistage in a job script (its cache: ``OCISTAGE_CACHE``, exported by sbatch)."""
        return shlex.join(self.runner.command)

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.cluster.run(*argv, user=self.user, env=self.runner.environment(),
                                cwd=self.base, timeout=300)

    def ocistage(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = self.run(*self.runner.command, *args)
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    def sbatch(self, script: str) -> str:
        path = self.base / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/sh\nset -e\n" + script + "\n")
        path.chmod(0o755)
        subprocess.run(["chown", f"{self.user.uid}:{self.user.gid}", str(path)], check=True)
        return self.cluster.sbatch("-N3", f"--output={self.base}/slurm-%j.out", str(path),
                                   user=self.user, env=self.runner.environment(),
                                   cwd=self.base)

    def staged_leases(self, name: str) -> list[dict[str, object]]:
        """The leases on staged ``.../NAME`` in the user's cache, as their files say."""
        found = []
        for path in sorted((self.runner.cache / "leases").glob("*.json")):
            doc = json.loads(path.read_text())
            if str(doc["target"]).endswith(f"/{name}"):
                found.append(doc)
        return found


@pytest.fixture(scope="module")
def job_user() -> Iterator[JobUser]:
    with job_user_account("ocistage-allnodes") as user:
        yield user


@pytest.fixture
def as_user(slurm_nodes: SlurmCluster, job_user: JobUser, shared_dir: Path) -> _User:
    base = shared_dir / "user"
    base.mkdir()
    return _User(slurm_nodes, job_user, base)


def _copies(cluster: SlurmCluster, name: str) -> list[str]:
    """The nodes holding a staged copy ``name``."""
    return [node for node in cluster.nodes
            if (cluster.node_dir(node) / name / "rootfs" / "bin" / "busybox").is_file()]


def _wait_for(path: Path, user: _User, job_id: str, timeout: float = 300) -> None:
    """Wait until the job made ``path``; fail with its output if it ended first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        record = user.cluster.job_record(job_id)
        log = user.base / f"slurm-{job_id}.out"
        state = record.get("JobState", "GONE" if log.exists() else "PENDING")
        if time.monotonic() > deadline or state not in ("PENDING", "RUNNING", "CONFIGURING"):
            pytest.fail(f"{path} not made: {record}\n{log.read_text() if log.exists() else ''}")
        time.sleep(0.3)


def _wait_until_removed(cluster: SlurmCluster, name: str) -> None:
    deadline = time.monotonic() + REMOVAL_DEADLINE
    while _copies(cluster, name) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _copies(cluster, name) == [], f"still there {REMOVAL_DEADLINE:.0f}s after the job"


def _stage_then_wait(user: _User, ref: str, name: str, flag: Path, go: Path) -> str:
    """A job script: stage ``ref`` on every node as ``name`` (its JSON in ``flag``), then
    wait for ``go`` (made by the test)."""
    out = user.base / f"{name}.json"
    return (f"{user.command} stage --all-nodes {shlex.quote(ref)} --to "
            f"{shlex.quote(str(user.cluster.node_local))} --name {name} --json "
            f"> {shlex.quote(str(out))}\n"
            f"mv {shlex.quote(str(out))} {shlex.quote(str(flag))}\n"
            f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.2; done")


def test_copies_go_when_the_job_ends_and_gc_elsewhere_keeps_their_leases_until_then(
        slurm_nodes: SlurmCluster, as_user: _User, images: dict[str, ImageRef]) -> None:
    cluster, user = slurm_nodes, as_user
    flag, go = user.base / "staged.json", user.base / "go"
    job_id = user.sbatch(_stage_then_wait(user, images["busybox"].ref, "app", flag, go))
    _wait_for(flag, user, job_id)
    results = json.loads(flag.read_text())
    assert [r["node"] for r in results] == ["n1", "n2", "n3"]
    cleanups = [str(r["cleanup_job_id"]) for r in results]
    assert all(c.isdigit() for c in cleanups), results
    assert _copies(cluster, "app") == ["n1", "n2", "n3"]
    leases = user.staged_leases("app")
    assert {lease["node"] for lease in leases} == {"n1", "n2", "n3"}  # one per node's copy
    assert {lease["holder"]["job_id"] for lease in leases} == {job_id}  # type: ignore[index]

    # gc on the host while the job runs: its leases are live
    user.ocistage("cache", "gc")
    assert len(user.staged_leases("app")) == 3
    # the cleanup jobs held (as a busy cluster would keep them waiting), the job ended: a gc
    # on the host cannot reach the nodes' copies, so it keeps their dead leases and says so
    cluster.scontrol("hold", ",".join(cleanups), check=True)
    go.touch()
    cluster.wait_until_gone_from_squeue(job_id, timeout=120)
    gc = user.ocistage("cache", "gc", "--json")
    left = json.loads(gc.stdout)["left"]
    assert sorted(entry["name"] for entry in left) == [
        f"{cluster.node_local}/app on node {node}" for node in ("n1", "n2", "n3")], left
    assert len(user.staged_leases("app")) == 3
    assert _copies(cluster, "app") == ["n1", "n2", "n3"]

    cluster.scontrol("release", ",".join(cleanups), check=True)
    _wait_until_removed(cluster, "app")
    for cleanup in cleanups:
        assert cluster.wait_for_job(cleanup)["JobState"] == "COMPLETED"
    assert user.staged_leases("app") == []
    gc = user.ocistage("cache", "gc", "--json")
    assert json.loads(gc.stdout)["left"] == []


def test_copies_go_when_the_job_is_cancelled(
        slurm_nodes: SlurmCluster, as_user: _User, images: dict[str, ImageRef]) -> None:
    cluster, user = slurm_nodes, as_user
    flag = user.base / "staged.json"
    job_id = user.sbatch(_stage_then_wait(user, images["busybox"].ref, "cancelled", flag,
                                          user.base / "never"))
    _wait_for(flag, user, job_id)
    assert _copies(cluster, "cancelled") == ["n1", "n2", "n3"]
    cluster.run("scancel", job_id, check=True)
    _wait_until_removed(cluster, "cancelled")
    assert cluster.job_record(job_id).get("JobState") in ("CANCELLED", None, "")
    assert user.staged_leases("cancelled") == []


def test_a_pin_keeps_the_copies_past_the_job_until_unstage_pin_on_each_node(
        slurm_nodes: SlurmCluster, as_user: _User, images: dict[str, ImageRef]) -> None:
    cluster, user = slurm_nodes, as_user
    path = shlex.quote(str(cluster.node_local / "pinned"))
    job_id = user.sbatch(
        f"{user.command} stage -q --all-nodes {shlex.quote(images['busybox'].ref)} --to "
        f"{shlex.quote(str(cluster.node_local))} --name pinned --pin keep > /dev/null")
    assert cluster.wait_for_job(job_id, timeout=300)["JobState"] == "COMPLETED"
    cluster.wait_until_gone_from_squeue(job_id, timeout=120)
    user.ocistage("cache", "gc")
    assert _copies(cluster, "pinned") == ["n1", "n2", "n3"]
    assert len(user.staged_leases("pinned")) == 3
    # unstage --pin on all three nodes at once: each releases its own node's lease
    job_id = user.sbatch(f"srun --nodes=3 --ntasks=3 --ntasks-per-node=1 {user.command} "
                         f"unstage --pin keep {path}")
    assert cluster.wait_for_job(job_id, timeout=300)["JobState"] == "COMPLETED"
    assert _copies(cluster, "pinned") == []
    assert user.staged_leases("pinned") == []
