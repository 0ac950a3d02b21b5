"""Every `ocistage runtime oci-conf` template whose runtime is installed here runs a job on the
three-node Slurm 24.05 test cluster: the template (for 24.05, lint-clean) replaces the
cluster's oci.conf for the test, and `srun --container` runs a bundle from `ocistage bundle`
with it. Run mode only: with create/start the step hung on 24.05.8 (`runc init` waiting for
its start; not diagnosed, docs/slurm.md)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from runtimes.oci_conf import RUNTIMES
from tests.e2e.components import require_binary
from tests.e2e.conftest import OcistageRunner
from tests.e2e.images import OS_RELEASE_NAME, ImageRef
from tests.e2e.slurm import SlurmCluster

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("mode", ["run"])
@pytest.mark.parametrize("runtime", [r for r in RUNTIMES if shutil.which(r)])
def test_template_runs_a_container_job(slurm_24_05: SlurmCluster, ocistage: OcistageRunner,
                                       images: dict[str, ImageRef], shared_dir: Path,
                                       runtime: str, mode: str) -> None:
    root = shared_dir / "state" / f"%u-{runtime}"
    conf = ocistage("runtime", "oci-conf", "--runtime", runtime, "--mode", mode,
                    "--slurm-version", "24.05", "--root", str(root),
                    env=slurm_24_05.env, check=True).stdout
    draft = shared_dir / "oci.conf"
    draft.write_text(conf)
    ocistage("runtime", "oci-conf", "--check", str(draft), "--slurm-version", "24.05",
             check=True)
    bundle = shared_dir / "bundle"
    ocistage("bundle", images["busybox"].ref, str(bundle), check=True)
    if runtime == "crun":
        _skip_if_crun_cannot_run_here(bundle, shared_dir)
    with slurm_24_05.use_oci_conf(conf):
        result = slurm_24_05.srun("-N1", f"--container={bundle}", "/bin/sh", "-c",
                                  "grep ^NAME= /etc/os-release; id -u", timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f'NAME="{OS_RELEASE_NAME}"', "1000"], result.stderr


def _skip_if_crun_cannot_run_here(bundle: Path, work: Path) -> None:
    """crun < 1.9 refuses hosts with cgroup v1 controllers plus a cgroup2 hierarchy (hybrid
    mode, the template's note): then no template can make it run a job on this host."""
    crun = require_binary("crun")
    probe = subprocess.run([crun, "--rootless=true", f"--root={work / 'crun-probe'}", "run",
                            "--bundle", str(bundle), "ocistage-crun-probe"],
                           capture_output=True, text=True, timeout=120, check=False,
                           stdin=subprocess.DEVNULL)
    subprocess.run([crun, f"--root={work / 'crun-probe'}", "delete", "--force",
                    "ocistage-crun-probe"], capture_output=True, timeout=60, check=False)
    if "hybrid mode not supported" in probe.stderr:
        pytest.skip(f"crun cannot run containers on this host: {probe.stderr.strip()}")
