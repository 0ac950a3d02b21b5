"""A user other than root bundles an image with a non-root user and runs it with the host's runc
(issue 28, item 2): ``bundle`` warns about what runc would refuse, and the command line it gives
runs. nobody (``setpriv``) without XDG_RUNTIME_DIR, as after ``su`` or in a batch job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.runtimes.userrun import runc_version
from pytest_ocistage.components import require_binary
from pytest_ocistage.imagebuild import Dir, build_image, busybox_layer
from pytest_ocistage.runner import ocistage_command

NOBODY = 65534

pytestmark = pytest.mark.needs_root("needs root to act as another user (setpriv)")


@pytest.fixture
def home() -> Iterator[Path]:
    """nobody's HOME, holding an image whose user is app (1000)."""
    top = Path(tempfile.mkdtemp(prefix="ocistage-userrunc-", dir="/tmp"))
    try:
        top.chmod(0o755)
        layer = busybox_layer()
        layer["home/app"] = Dir(0o755, 1000, 1000)
        build_image(top / "layout", [layer], user="app", workdir="/home/app",
                    cmd=["sh", "-c", "id -u; echo $HOME"])
        subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(top)], check=True)
        yield top
    finally:
        shutil.rmtree(top)


def as_nobody(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` as nobody, with a login-less environment: no XDG_RUNTIME_DIR."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "OCISTAGE_CACHE": str(home / "cache"),
           "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "NO_COLOR": "1"}
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                           "--clear-groups", "env", "-i",
                           *(f"{key}={value}" for key, value in env.items()), *argv],
                          capture_output=True, text=True, timeout=300, cwd=home,
                          stdin=subprocess.DEVNULL)


def bundle(home: Path, dest: Path, *options: str) -> list[str]:
    """The warnings of ``bundle`` (as --json gives them, and as printed)."""
    result = as_nobody(home, *ocistage_command(), "bundle", "--json", *options,
                       f"oci:{home / 'layout'}:latest", str(dest))
    assert result.returncode == 0, result.stderr
    warnings: list[str] = json.loads(result.stdout)["warnings"]
    assert [f"warning: {text}" for text in warnings] == [
        line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    return warnings


def test_the_warned_limits_are_runcs_and_the_given_command_line_runs(home: Path) -> None:
    runc = require_binary("runc")
    version = runc_version(runc)
    image_user = bundle(home, home / "image-user")
    mapped = bundle(home, home / "mapped", "--map-root")
    state_fix = f'runc --root "$HOME/.local/state/runc" run -b {home / "mapped"} NAME'
    assert mapped[-1].startswith("XDG_RUNTIME_DIR is not set")
    assert mapped[-1].endswith(state_fix)
    # without --root: what the warning says runc says
    plain = as_nobody(home, runc, "run", "-b", str(home / "mapped"), "t1")
    assert plain.returncode != 0 and "/run/runc" in plain.stderr
    assert "permission denied" in plain.stderr
    # the command line of the warning, as the user's shell runs it
    fixed = as_nobody(home, "sh", "-c", state_fix.replace("NAME", f"t-{os.getpid()}"))
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.split() == ["0", "/home/app"]
    if version is None or version >= (1, 2):
        assert len(image_user) == 1  # only the state directory
        return
    [mapping, state] = image_user
    assert mapping.startswith(f"runc {'.'.join(map(str, version))} (on PATH) "
                                           "cannot run this bundle as you")
    assert state.startswith("XDG_RUNTIME_DIR is not set")
    refused = as_nobody(home, "sh", "-c", state.rsplit("--root: ", 1)[1]
                        .replace("NAME", f"t2-{os.getpid()}"))
    assert refused.returncode != 0
    assert ("User namespaces enabled, but no user mapping found." in refused.stderr
            or "fchown fd 7: operation not permitted" in refused.stderr), refused.stderr
