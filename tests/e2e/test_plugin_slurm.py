"""A user's test with the plugin's fixtures alone: an image built and pushed in the test, pulled
and bundled by ocistage, runs under ``srun --container`` on the private 22.05 Slurm."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ocistage import File, Registry, busybox_layer
from pytest_ocistage.plugin import ImageFactory
from pytest_ocistage.runner import OcistageRunner
from pytest_ocistage.slurm import SlurmCluster

pytestmark = pytest.mark.timeout(600)


def test_an_image_of_the_test_runs_under_srun_container(
        slurm_22_05: SlurmCluster, oci_registry: Registry, oci_image: ImageFactory,
        ocistage: OcistageRunner, shared_dir: Path) -> None:
    job = File('#!/bin/sh\necho "job $SLURM_JOB_ID on $(id -un): $GREETING"\n', mode=0o755)
    image = oci_image([busybox_layer(), {"app/job.sh": job}], cmd=["/app/job.sh"],
                      env={"GREETING": "from the plugin"}, user="app", workdir="/app")
    pushed = image.push(oci_registry, "plugin/slurm-job")
    bundle = shared_dir / "bundle"
    ocistage("bundle", pushed.ref, str(bundle), check=True)
    result = slurm_22_05.srun(f"--container={bundle}", "/app/job.sh", timeout=180)
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    assert words[0] == "job" and words[1].isdigit()
    assert words[2:] == ["on", "app:", "from", "the", "plugin"]
