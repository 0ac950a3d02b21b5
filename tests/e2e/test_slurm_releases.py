"""Image environments, RunTimeQuery after the container is gone, and the release rules, on
each private test cluster (``slurm_cluster``: Debian's 22.05, the built 24.05.8 and 26.05.3).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ocistage.imagebuild import File, build_image, busybox_layer
from pytest_ocistage.slurm import SlurmCluster, read_output
from tests.e2e.conftest import OcistageRunner

pytestmark = pytest.mark.timeout(600)

APP_PATH = "/opt/app/bin:/usr/bin:/bin"
PROBE = 'echo "path=$PATH"; echo "home=$HOME"; echo "cwd=$(pwd)"; apptool'


def _app_image(layout: Path) -> str:
    """An image whose tool lives in /opt/app/bin (on the image's PATH only), run as app."""
    layer = busybox_layer()
    layer["opt/app/bin/apptool"] = File('#!/bin/sh\necho "apptool ran"\n', mode=0o755)
    image = build_image(layout, [layer], env={"PATH": APP_PATH}, user="app",
                        workdir="/work/here", cmd=["/bin/sh", "-c", PROBE])
    return image.ref


def _values(output: str) -> dict[str, str]:
    values = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("path", "home", "cwd"):
            values[key] = value
    return values


def test_submit_srun_runs_with_the_image_environment(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, shared_dir: Path,
        tmp_path: Path) -> None:
    ref = _app_image(tmp_path / "layout")
    result = ocistage.run_process("submit", ref, "--srun", "--stage-to",
                                  str(shared_dir / "staged"), "--time=5",
                                  env=slurm_cluster.env)
    assert result.returncode == 0, result.stderr
    values = _values(result.stdout)
    assert values == {"path": APP_PATH, "home": "/home/app", "cwd": "/work/here"}
    assert "apptool ran" in result.stdout
    _assert_no_query_errors(result.stdout + result.stderr)


def _assert_no_query_errors(output: str) -> None:
    """slurmstepd's complaints about RunTimeQuery after the container is gone (22.05: runc's
    logfmt error parsed as JSON; 26.05: its non-zero status)."""
    assert "_try_parse" not in output
    assert "JSON parsing error" not in output
    assert "RunTimeQuery failed" not in output
    assert "unable to parse container state" not in output


def test_submit_sbatch_runs_with_the_image_environment_and_a_clean_output(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, shared_dir: Path,
        tmp_path: Path) -> None:
    ref = _app_image(tmp_path / "layout")
    output = shared_dir / "job.out"
    result = ocistage("submit", ref, "--stage-to", str(shared_dir / "staged"), "--time=5",
                      f"--output={output}", env=slurm_cluster.env, check=True)
    record = slurm_cluster.wait_for_job(result.stdout.strip())
    text = read_output(output)
    assert record["JobState"] == "COMPLETED", (record, text)
    assert _values(text) == {"path": APP_PATH, "home": "/home/app", "cwd": "/work/here"}
    assert "apptool ran" in text
    _assert_no_query_errors(text)


def test_submit_host_env_runs_with_the_callers_path_and_home(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, shared_dir: Path,
        tmp_path: Path) -> None:
    ref = _app_image(tmp_path / "layout")
    env = {**slurm_cluster.env, "PATH": slurm_cluster.env["PATH"] + ":/caller/bin",
           "HOME": "/caller/home"}
    result = ocistage.run_process("submit", ref, "--srun", "--host-env", "--stage-to",
                                  str(shared_dir / "staged"), "--time=5", "--", "/bin/sh",
                                  "-c", 'echo "path=$PATH"; echo "home=$HOME"', env=env)
    assert result.returncode == 0, result.stderr
    assert _values(result.stdout) == {"path": env["PATH"], "home": "/caller/home"}
    _assert_no_query_errors(result.stdout + result.stderr)
