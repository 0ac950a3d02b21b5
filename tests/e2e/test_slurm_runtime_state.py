"""Issue 34 item 6: a job user with no login session on the node (no ``/run/user/UID``) runs
``srun --container`` through the generated oci.conf on 22.05, 24.05 and 26.05. Its runtime
keeps the container state in the step's spool directory (``%m``; ``%b`` on 22.05), which
slurmstepd makes for the job user and removes after the step: nothing is left behind."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.bundler.flows.bundle import make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.cache.store import Store
from ocistage.runtimes.oci_conf import lint_oci_conf
from ocistage.runtimes.slurm import SlurmVersion
from pytest_ocistage.imagebuild import build_image, busybox_layer
from pytest_ocistage.jobuser import JobUser, job_user_account
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner

pytestmark = pytest.mark.timeout(600)

NO_SESSION_USER = "ocistage-nosession"


@pytest.fixture(scope="module")
def sessionless_user() -> Iterator[JobUser]:
    """A created user without ``/run/user/UID`` (removed at the end)."""
    with job_user_account(NO_SESSION_USER, login_session=False) as user:
        yield user


def test_user_without_login_session_runs_a_container_through_the_generated_oci_conf(
        slurm_cluster: SlurmCluster, sessionless_user: JobUser, shared_dir: Path,
        ocistage: OcistageRunner) -> None:
    user = sessionless_user
    assert not Path(f"/run/user/{user.uid}").exists()
    conf = slurm_cluster.oci_conf.read_text()  # `ocistage runtime oci-conf`, as generated
    assert "/run/user" not in conf
    assert lint_oci_conf(conf, SlurmVersion.parse(slurm_cluster.version)) == []
    report = json.loads(ocistage("doctor", "--json", env=slurm_cluster.env).stdout)
    [state] = [check for check in report["checks"] if check["name"] == "runtime_state"]
    assert state["status"] == "ok", state
    image = build_image(shared_dir / "layout", [busybox_layer()], cmd=["/bin/sh"])
    bundle = make_bundle(parse_reference(image.ref), Store.open(shared_dir / "cache"),
                         shared_dir / "bundle",
                         config_options=ConfigOptions(host_uid=user.uid, host_gid=user.gid,
                                                      map_root=True)).path
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(bundle)], check=True,
                   timeout=60)
    result = slurm_cluster.srun(f"--container={bundle}", "/bin/sh", "-c",
                                "echo in-container uid=$(id -u)", user=user, cwd=shared_dir,
                                timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "in-container uid=0" in result.stdout, result.stdout + result.stderr
    assert "permission denied" not in result.stderr
    # the runtime removed its state (the container's directory, named after its id) from
    # the step's spool directory; slurmstepd removes that directory after the step, though
    # 24.05 may do it after srun returned (or leave config.json: Slurm's own cleanup)
    spool = slurm_cluster.base / "spool"
    deadline = time.monotonic() + 30
    while any(spool.glob("*/oci-job*")) and time.monotonic() < deadline:
        time.sleep(0.5)
    state = [str(path) for path in spool.rglob(f"*.{user.name}.*")]
    assert state == [], state
