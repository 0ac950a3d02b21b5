"""Issue 34 item 3: ``srun --mpi=pmix -N3 --container`` run by a created (ordinary) user on the
26.05 cluster, through the generated crun oci.conf (runtime state in the step's spool directory)
and a ``--map-self`` bundle (the ranks run as the user's own uid/gid inside: PMIx checks the
ids a client reports), with ``ContainerPath`` at one path on every node, a root-owned
directory per node (as ``SlurmdSpoolDir`` is on a real cluster). Hard timeouts; nodes left
COMPLETING or DRAINED by a failed step are freed in teardown."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.bundler.flows.bundle import make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.cache.store import Store
from ocistage.runtimes.oci_conf import lint_oci_conf
from ocistage.runtimes.pmix_ids import pmix_credential_problem
from ocistage.runtimes.slurm import SlurmVersion
from pytest_ocistage.jobuser import JobUser
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.test_slurm_mpi import mpi_image  # noqa: F401  (the module's image fixture)

pytestmark = pytest.mark.timeout(900)

SPOOL = "oci-spool"


def _free_nodes(cluster: SlurmCluster) -> None:
    """Cancel what is left and resume nodes a hung step left COMPLETING/DRAINED/DOWN."""
    jobs = cluster.run("squeue", "-h", "-o", "%A", timeout=30).stdout.split()
    if jobs:
        cluster.run("scancel", "-f", *jobs, timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = cluster.run("sinfo", "-h", "-N", "-o", "%N %T", timeout=30).stdout.split("\n")
        busy = [line for line in states if line.strip() and not line.split()[1].startswith(
            ("idle", "mixed"))]
        if not busy:
            return
        for line in busy:
            node, state = line.split()[:2]
            if state.startswith(("drain", "down", "fail")):
                cluster.scontrol("update", f"NodeName={node}", "State=RESUME", timeout=30)
            elif state.startswith("completing") and time.monotonic() > deadline - 40:
                # a hung slurmstepd: kill its processes in that node's namespace by pid
                _kill_stepds(cluster, node)
        time.sleep(1)


def _kill_stepds(cluster: SlurmCluster, node: str) -> None:
    """Kill (by pid) the slurmstepds of ``node`` of this cluster: the processes named
    slurmstepd in the mount namespace of the slurmd started with this cluster's slurm.conf
    and ``-N node`` (never another cluster's)."""
    conf = str(cluster.slurm_conf).encode()
    slurmd_ns = None
    processes: list[tuple[int, str, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            comm = (entry / "comm").read_text().strip()
            namespace = str((entry / "ns" / "mnt").readlink())
        except OSError:
            continue
        processes.append((int(entry.name), comm, namespace))
        if comm == "slurmd" and conf in argv and node.encode() in argv:
            slurmd_ns = namespace
    if slurmd_ns is None:
        return
    for pid, comm, namespace in processes:
        if comm == "slurmstepd" and namespace == slurmd_ns:
            subprocess.run(["kill", "-9", str(pid)], check=False, timeout=30)


@pytest.fixture
def container_path(slurm_26_05: SlurmCluster) -> Iterator[str]:
    """``ContainerPath``: one path on every node, a directory of root's (0755) per node."""
    made = []
    for node in slurm_26_05.nodes:
        path = slurm_26_05.node_dir(node) / SPOOL
        if not path.exists():
            path.mkdir(mode=0o755)
            made.append(path)
    yield str(slurm_26_05.node_local / SPOOL)
    _free_nodes(slurm_26_05)
    for path in made:
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False, timeout=60)


def test_srun_mpi_pmix_n3_container_as_an_ordinary_user(
        slurm_26_05: SlurmCluster, slurm_job_user: JobUser, shared_dir: Path,
        mpi_image: str, container_path: str) -> None:  # noqa: F811
    user = slurm_job_user
    if shutil.which("crun") is None:
        pytest.skip("crun is not installed: runc 1.1 needs container uid 0 mapped, which makes "
                    "the ranks' PMIx credential 0/0 (runtimes/pmix_ids.py)")
    # the ranks run as the job user's own uid/gid inside the container (--map-self): PMIx's
    # native security (ptl/tcp) checks the uid/gid the client reports against the job's
    options = ConfigOptions(host_uid=user.uid, host_gid=user.gid, map_self=True,
                            root_placeholder=None)
    bundle = make_bundle(parse_reference(mpi_image), Store.open(shared_dir / "cache"),
                         shared_dir / "bundle", config_options=options).path
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(bundle)], check=True,
                   timeout=120)
    config = json.loads((bundle / "config.json").read_text())
    assert pmix_credential_problem(config) is None
    text = subprocess.run([sys.executable, "-m", "ocistage", "runtime", "oci-conf", "--runtime",
                           "crun", "--slurm-version", "26.05"], capture_output=True, text=True,
                          check=True, timeout=60).stdout
    conf = text + f'ContainerPath="{container_path}"\n'
    assert lint_oci_conf(conf, SlurmVersion.parse(slurm_26_05.version)) == []
    with slurm_26_05.use_oci_conf(conf):
        result = slurm_26_05.srun("--mpi=pmix", "-N3", "-n3", "--time=2",
                                  f"--container={bundle}", "/opt/app/bin/mpihello",
                                  user=user, cwd=shared_dir, timeout=150)
    logs = "".join(line for path in sorted(slurm_26_05.log_dir.glob("slurmd-*.log"))
                   for line in path.read_text(errors="replace").splitlines(keepends=True)
                   if "pmix" in line.lower() or "error" in line.lower())
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-1500:] + logs[-6000:]
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    assert lines == [f"rank {rank} of 3 on n{rank + 1} sum 3" for rank in range(3)], (
        result.stdout + result.stderr)
