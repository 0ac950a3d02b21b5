"""``run_bundle`` for a user other than root (issue 34, item 3): the documented example's bundle
(an image user, ``app``) runs as that user, and a runtime that cannot run it says why instead
of returning runc's bare ``(1, '')``. Run by root, the same as nobody is not the same thing (no
subordinate ids): these tests are a user's, and CI runs them as the user it creates."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_ocistage import File, busybox_layer
from pytest_ocistage.bundles import cannot_run, run_bundle
from pytest_ocistage.components import require_binary, running_as_root
from pytest_ocistage.plugin import ImageFactory
from pytest_ocistage.runner import OcistageRunner

pytestmark = pytest.mark.skipif(running_as_root(), reason="about a user's run (CI runs it as "
                                                          "the user it creates)")
JOB = File('#!/bin/sh\necho "$(id -un) $(id -u):$(id -g)"\n', mode=0o755)


@pytest.fixture
def bundle(oci_image: ImageFactory, ocistage: OcistageRunner, tmp_path: Path) -> Path:
    image = oci_image([busybox_layer(), {"app/job.sh": JOB}], entrypoint=["/app/job.sh"],
                      user="app")
    made = ocistage("bundle", image.ref, str(tmp_path / "bundle"), check=True)
    return Path(made.stdout.strip())


def test_the_image_user_runs_as_itself(bundle: Path, tmp_path: Path) -> None:
    run = run_bundle(bundle, tmp_path / "state")
    assert (run.exit_code, run.stdout) == (0, "app 1000:1000\n"), (run.runtime, run.stderr)


def test_runc_before_1_2_says_why_it_cannot(bundle: Path, tmp_path: Path) -> None:
    runc = require_binary("runc")
    problem = cannot_run("runc", runc, bundle)
    plain = subprocess.run([runc, "--rootless=true", "--root", str(tmp_path / "runc"), "run",
                            "--bundle", str(bundle), "t1"], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=120, check=False)
    subprocess.run([runc, "--root", str(tmp_path / "runc"), "delete", "--force", "t1"],
                   capture_output=True, timeout=60, check=False)
    if problem is None:  # runc 1.2 or later
        assert (plain.returncode, plain.stdout) == (0, "app 1000:1000\n"), plain.stderr
        return
    # what runc itself says, and that the reason names it and what to install
    assert plain.returncode != 0 and plain.stdout == ""
    assert "fchown fd" in plain.stderr or "no user mapping" in plain.stderr, plain.stderr
    assert "fchown fd 7" in problem and "apt-get install crun" in problem
