"""Run an OCI runtime bundle (``rootfs/`` + ``config.json``) under rootless runc or crun.

Each run gets its own runtime state directory (``--root``) and a unique container id, and the
container is deleted afterwards, whatever happened; nothing is left in the runtime's default
state directory.

crun 1.8 refuses every container on a hybrid cgroup v1+v2 host whose v2 hierarchy has
controllers ("cgroups in hybrid mode not supported"). There, as root, crun runs in a private
mount namespace with the v2 hierarchy unmounted (a test-host workaround: the host's mounts are
untouched); as another user the test is skipped.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_ocistage.components import Outcome, require_binary

RUNTIMES = ("runc", "crun")


@dataclass(frozen=True)
class BundleRun(Outcome):
    """What the container's process did, and under which runtime."""

    runtime: str


def run_bundle(bundle: Path, state_dir: Path, runtime: str = "runc",
               timeout: float = 120) -> BundleRun:
    """Run bundle to completion with ``RUNTIME --rootless=true run`` and capture its output.

    The runtime binary missing skips the test naming its Debian package (a failure under
    OCISTAGE_REQUIRE_E2E=1).
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
    binary = require_binary(runtime)
    state_dir.mkdir(parents=True, exist_ok=True)
    container = f"ocistage-test-{uuid.uuid4().hex[:12]}"
    base = [*hybrid_cgroup_prefix(runtime), binary, "--rootless=true",
            "--root", str(state_dir)]
    try:
        result = subprocess.run([*base, "run", "--bundle", str(bundle), container],
                                capture_output=True, text=True, timeout=timeout,
                                stdin=subprocess.DEVNULL, check=False)
    finally:
        subprocess.run([*base, "delete", "--force", container], capture_output=True,
                       timeout=60, stdin=subprocess.DEVNULL, check=False)
    return BundleRun(returncode=result.returncode, stdout=result.stdout, stderr=result.stderr,
                     runtime=runtime)


def hybrid_cgroups() -> bool:
    """Whether this is a cgroup v1+v2 hybrid host whose v2 hierarchy has controllers."""
    controllers = Path("/sys/fs/cgroup/unified/cgroup.controllers")
    return os.path.ismount("/sys/fs/cgroup/unified") and controllers.exists() and bool(
        controllers.read_text().strip())


def hybrid_cgroup_prefix(runtime: str) -> list[str]:
    """The argv prefix that lets crun run on a hybrid host (see the module docstring)."""
    if runtime != "crun" or not hybrid_cgroups():
        return []
    if os.geteuid() != 0:
        pytest.skip("crun refuses this hybrid cgroup host and only root can hide cgroup v2")
    return [require_binary("unshare"), "-m", "--propagation", "private", "sh", "-c",
            'umount /sys/fs/cgroup/unified && exec "$@"', "sh"]
