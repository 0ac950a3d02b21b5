"""``srun --mpi=pmix -N3 --container=BUNDLE`` of the OpenMPI program of test_slurm_mpi.py, as an
unprivileged job user (``slurm_job_user``: no sudo, no login session) with a bundle of their own
that maps them to the container's root (``map_root``, as runc 1.1 under Slurm needs), on the
26.05 cluster with PMIx (docs/site.md, "MPI"; issue 38: what was verified as whom).

It fails today, and the test says how: the step starts (oci.conf's ContainerPath is a directory per
node that users may create their step's spool directory in, mode 1777; with root's 0755 one
slurmstepd stops with ``unable to create spool directory ...: Permission denied``), but every
rank stops in ``MPI_Init`` with ``OPAL ERROR: Unreachable in file ext3x_client.c`` and "OMPI was
not built with SLURM's PMI support", where root's run of the same bundle shape passes
(test_slurm_mpi.py). Once it runs, this test fails: docs/site.md and the test change then.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ocistage.bundler.bundle import make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.cache.store import Store
from pytest_ocistage.imagebuild import build_image, busybox_layer
from pytest_ocistage.slurm import JobUser, SlurmCluster
from tests.e2e.test_slurm_mpi import _mpi_root

pytestmark = pytest.mark.timeout(900)


def test_srun_mpi_pmix_n3_container_as_an_unprivileged_user_stops_in_mpi_init(
        slurm_26_05: SlurmCluster, slurm_job_user: JobUser, shared_dir: Path) -> None:
    user = slurm_job_user
    work = shared_dir / "image"
    work.mkdir()
    image = build_image(work / "layout", [busybox_layer(), _mpi_root(work)],
                        env={"PATH": "/opt/app/bin:/usr/bin:/bin"},
                        cmd=["/opt/app/bin/mpihello"])
    store = Store.open(shared_dir / "cache")
    bundle = make_bundle(parse_reference(image.ref), store, shared_dir / "bundle",
                         config_options=ConfigOptions(host_uid=user.uid, host_gid=user.gid,
                                                      map_root=True)).path
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(bundle)], check=True)
    # the spool directory at one path on every node, a directory per node (docs/slurm.md),
    # in which users may make their steps' (as /tmp)
    spools = [slurm_26_05.node_dir(node) / "oci-users" for node in slurm_26_05.nodes]
    for spool in spools:
        spool.mkdir()
        spool.chmod(0o1777)
    conf = (slurm_26_05.oci_conf.read_text()
            + f'ContainerPath="{slurm_26_05.node_local}/oci-users"\n')
    try:
        with slurm_26_05.use_oci_conf(conf):
            result = slurm_26_05.srun("--mpi=pmix", "-N3", "-n3", "--time=2",
                                      f"--container={bundle}", "/opt/app/bin/mpihello",
                                      user=user, cwd=shared_dir, timeout=180)
    finally:
        for spool in spools:
            shutil.rmtree(spool, ignore_errors=True)
    ranks = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    if result.returncode == 0 and ranks == [f"rank {rank} of 3 on n{rank + 1} sum 3"
                                            for rank in range(3)]:
        pytest.fail("an unprivileged user's MPI step runs now: say so in docs/site.md (MPI) and "
                    "make this test check that it does", pytrace=False)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "OPAL ERROR: Unreachable in file ext3x_client.c" in result.stderr, result.stderr
    assert "unable to create spool directory" not in result.stderr, result.stderr
