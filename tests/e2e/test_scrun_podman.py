"""The config.json that Debian's podman hands to its OCI runtime (scrun), after
`ocistage scrun stage-in`, runs under rootless runc.

podman runs with the containers.conf of `ocistage runtime podman-config`, whose runtime is a
capture script standing where scrun stands: it keeps the bundle podman made (config.json and a
copy of the rootfs, which podman removes once its runtime failed) and refuses to run. The
captured bundle goes through the real `ocistage scrun stage-in`, and the staged bundle must run
with `runc --rootless=true` as the job user: root, and an unprivileged user (setpriv). Without
the rewrite, runc fails in turn on /proc (podman's `pidns = "host"`), sysfs (no network
namespace), devpts gid=5 and RLIMIT_NOFILE above the hard limit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ocistage.runtimes.engines import podman_containers_conf
from pytest_ocistage.components import require_binary, require_root
from pytest_ocistage.images import FixtureLayouts
from tests.e2e.conftest import OcistageRunner

NOBODY = 65534

CAPTURE = """#!{python}
import json, os, subprocess, sys
out = {out!r}
args = sys.argv[1:]
if "create" in args and "--bundle" in args:
    bundle = args[args.index("--bundle") + 1]
    with open(os.path.join(bundle, "config.json")) as file:
        config = json.load(file)
    os.makedirs(out)
    subprocess.run(["cp", "-a", config["root"]["path"], out + "/rootfs"], check=True)
    with open(out + "/podman-root-path", "w") as file:
        file.write(config["root"]["path"])
    config["root"]["path"] = out + "/rootfs"
    with open(out + "/config.json", "w") as file:
        json.dump(config, file)
sys.stderr.write("capture runtime: not running containers\\n")
sys.exit(1)
"""


def _podman_bundle(request: pytest.FixtureRequest, tmp_path: Path, layouts: FixtureLayouts,
                   *command: str) -> Path:
    """The bundle podman hands its runtime for `podman run busybox COMMAND` (captured)."""
    podman, skopeo = require_binary("podman"), require_binary("skopeo")
    out = tmp_path / "captured"
    capture = tmp_path / "capture-runtime"
    capture.write_text(CAPTURE.format(python=sys.executable, out=str(out)))
    capture.chmod(0o755)
    conf = tmp_path / "containers.conf"
    conf.write_text(podman_containers_conf(str(capture)))
    root = tmp_path / "podman-root"
    runroot = Path(tempfile.mkdtemp(prefix="ocs-pod-", dir="/tmp"))  # podman: <= 50 characters
    request.addfinalizer(lambda: shutil.rmtree(runroot, ignore_errors=True))
    storage = f"containers-storage:[vfs@{root}+{runroot}]localhost/busybox:test"
    subprocess.run([skopeo, "copy", "-q", layouts.oci_ref("busybox"), storage], check=True,
                   timeout=300, capture_output=True)
    env = {**os.environ, "CONTAINERS_CONF": str(conf), "XDG_CONFIG_HOME": str(tmp_path / "x")}
    result = subprocess.run(
        [podman, "--root", str(root), "--runroot", str(runroot), "--storage-driver", "vfs",
         "--cgroup-manager", "cgroupfs", "--events-backend", "file", "run", "--rm",
         "--pull=never", "localhost/busybox:test", *command],
        capture_output=True, text=True, timeout=300, env=env, check=False)
    assert "capture runtime: not running containers" in result.stderr, result.stderr
    assert (out / "config.json").is_file(), result.stderr
    return out


def _runc(bundle: Path, state: Path, container_id: str,
          user: int | None = None) -> subprocess.CompletedProcess[str]:
    runc = require_binary("runc")
    argv = [runc, "--rootless=true", f"--root={state}", "run", "-b", str(bundle), container_id]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL, check=False)
    finally:
        subprocess.run([runc, f"--root={state}", "delete", "--force", container_id],
                       capture_output=True, check=False, timeout=60)


@pytest.fixture
def layouts(fixture_layouts_built: FixtureLayouts) -> FixtureLayouts:
    return fixture_layouts_built


def test_podman_config_after_stage_in_runs_under_rootless_runc_as_root(
        request: pytest.FixtureRequest, tmp_path: Path, layouts: FixtureLayouts,
        ocistage: OcistageRunner) -> None:
    require_root()  # podman with a private storage and runc as the job user 0: run as root
    captured = _podman_bundle(request, tmp_path, layouts, "echo from-podman; id -u; exit 3")
    config = json.loads((captured / "config.json").read_text())
    kinds = [ns["type"] for ns in config["linux"]["namespaces"]]
    assert "pid" not in kinds  # podman-config's pidns = "host": the case the rewrite handles
    stage = tmp_path / "stage"
    staged = ocistage("scrun", "stage-in", "--id", "pod1", "--bundle", str(captured),
                      "--stage-dir", str(stage), "--uid", "0", "--gid", "0", check=True)
    result = json.loads(staged.stdout)
    assert "pid namespace added (a proc mount needs its own)" in result["dropped"]
    run = _runc(Path(result["bundle"]), tmp_path / "runc-state", "pod1")
    # the image user (app, 1000) is mapped to the job user root; `exit 3` is the status
    assert (run.returncode, run.stdout) == (3, "from-podman\n1000\n"), run.stderr
    out = ocistage("scrun", "stage-out", "--bundle", result["bundle"], check=True)
    assert json.loads(out.stdout)["removed"] is True
    assert not Path(result["bundle"]).exists()


def test_podman_config_after_stage_in_runs_under_rootless_runc_as_a_job_user(
        request: pytest.FixtureRequest, tmp_path: Path, layouts: FixtureLayouts,
        ocistage: OcistageRunner) -> None:
    require_root()  # needs root to switch to the unprivileged job user
    # the job user's side: scrun (and so stage-in and runc) run as that user, who must reach
    # the engine's bundle (pytest's own temp dirs are private to root)
    tmp_path = Path(tempfile.mkdtemp(prefix="ocistage-scrun-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(tmp_path, ignore_errors=True))
    tmp_path.chmod(0o755)
    captured = _podman_bundle(request, tmp_path, layouts, "echo from-podman; id -u")
    # rootless podman's storage belongs to its user (container root is the user outside)
    subprocess.run(["chown", "-R", "--no-dereference", f"{NOBODY}:{NOBODY}", str(captured)],
                   check=True, timeout=120)
    stage = tmp_path / "stage"
    stage.mkdir(mode=0o1777)
    stage.chmod(0o1777)
    state = tmp_path / "runc-state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, NOBODY)
    home = tmp_path / "nobody"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)
    cache = home / "cache"
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            *ocistage.command, "scrun", "stage-in", "--id", "pod2", "--bundle", str(captured),
            "--stage-dir", str(stage), "--uid", str(NOBODY), "--gid", str(NOBODY),
            "--cache", str(cache)]
    env = ocistage.environment({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                                "XDG_CACHE_HOME": str(home / ".cache"),
                                "XDG_RUNTIME_DIR": str(home)})
    staged = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env,
                            cwd=tmp_path, check=False)
    assert staged.returncode == 0, staged.stderr
    result = json.loads(staged.stdout)
    assert any(d.startswith("process.user 1000:1000") for d in result["dropped"])
    run = _runc(Path(result["bundle"]), state, "pod2", user=NOBODY)
    # runs as container root, which is the job user outside
    assert (run.returncode, run.stdout) == (0, "from-podman\n0\n"), run.stderr
