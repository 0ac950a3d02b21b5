"""Docker through scrun as it is meant to run: Debian's docker.io in rootless mode
(``dockerd-rootless.sh``, rootlesskit) as an unprivileged user with subuid/subgid ranges and a
private XDG_RUNTIME_DIR, on each three-node cluster (``slurm_nodes``), with exactly the files
ocistage writes:

- ``~/.config/docker/daemon.json`` is ``ocistage runtime docker-config`` as the user runs it
  (default runtime ``slurm`` = scrun, ``vfs`` storage, no bridge, no ip forwarding), and
  ``docker run`` gets the flags it prints;
- scrun.lua is ``ocistage runtime scrun-lua --stage-to node-local`` as root runs it.

The daemon runs with rootlesskit's host network (``DOCKERD_ROOTLESS_ROOTLESSKIT_NET=host``,
port driver ``none``): ``/dev/net/tun`` is root's 0600 on these machines, so slirp4netns
cannot start (docs/slurm.md, "Rootless Docker"). It is stopped by its pid; its storage (files
of the user's subuids) is removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from ocistage.runtimes.engines import docker_run_flags
from pytest_ocistage.components import require_binary
from pytest_ocistage.images import ImageRef
from pytest_ocistage.jobuser import JobUser
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner
from tests.e2e.test_scrun_user import (
    RootlessEngine,
    _no_jobs_of,
    _scrun_lua,
    assert_engine_ran_the_job,
    site_slurm_conf,
    subids,  # noqa: F401 (a fixture, used by name)
    user_runtime_dir,
    users_file,
)

pytestmark = pytest.mark.timeout(900)
DOCKERD_ROOTLESS = Path("/usr/share/docker.io/contrib/dockerd-rootless.sh")
DOCKER = "/usr/bin/docker"  # Debian's client (another may come first on PATH)


@dataclass(frozen=True)
class RootlessDocker(RootlessEngine):
    def env(self) -> dict[str, str]:
        """The login shell's environment with the user's daemon socket and sbin on PATH."""
        env = super().env()
        env["DOCKER_HOST"] = f"unix://{self.runtime_dir}/docker.sock"
        env["PATH"] += ":/usr/sbin:/sbin"
        return env

    def docker(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.run(DOCKER, *args, timeout=timeout)


def _stop(process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """SIGTERM to the daemon's process group (rootlesskit, dockerd, containerd), by its pid;
    SIGKILL when it does not end in time."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=timeout)
    # what the daemon left in its group (containerd's shims) goes with it
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _wait_for_daemon(docker: RootlessDocker, process: subprocess.Popen[bytes],
                     log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        info = docker.docker("info", "--format", "{{.Driver}} {{.DefaultRuntime}}", timeout=60)
        if info.returncode == 0:
            assert info.stdout.split() == ["vfs", "slurm"], info.stdout
            return
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"rootless dockerd did not come up (exit {process.poll()}): "
                        f"{info.stderr}\n{log.read_text()[-4000:]}")
        time.sleep(0.5)


def _remove_new(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def docker_user(slurm_nodes: SlurmCluster, slurm_job_user: JobUser,
                subids: None,  # noqa: F811 (the fixture, by name)
                ocistage: OcistageRunner,
                images: dict[str, ImageRef]) -> Iterator[RootlessDocker]:
    cluster, user = slurm_nodes, slurm_job_user
    require_binary("dockerd", "docker.io")
    require_binary("containerd-shim-runc-v2", "containerd")
    require_binary("rootlesskit", "rootlesskit")
    if not Path(DOCKER).exists() or not DOCKERD_ROOTLESS.exists():
        require_binary(f"{DOCKER} and {DOCKERD_ROOTLESS}", "docker.io")
    if not (cluster.bin_dir / "scrun").exists():
        require_binary(f"scrun-of-the-{cluster.version}-build")
    with ExitStack() as stack:
        runtime_dir = user_runtime_dir(stack, user, "ocs-dxdg-")
        docker = RootlessDocker(cluster, user, runtime_dir,
                                cluster.node_local / "ocistage-scrun")
        config = ocistage("runtime", "docker-config", env=docker.env(), check=True)
        stack.enter_context(site_slurm_conf(cluster))
        stack.callback((cluster.conf_dir / "scrun.lua").unlink, missing_ok=True)
        # what the daemon and the client make in the home goes again (storage: root removes
        # files of the user's subuids; ~/.config/docker gets the daemon's key.json)
        new = [path for path in (user.home / ".local" / "share" / "docker",
                                 user.home / ".config" / "docker", user.home / ".docker")
               if not path.exists()]
        stack.callback(_remove_new, new)
        stack.enter_context(users_file(
            user.home / ".config" / "docker" / "daemon.json", config.stdout, user))
        log = runtime_dir / "dockerd.log"
        env = {**docker.env(), "DOCKERD_ROOTLESS_ROOTLESSKIT_NET": "host",
               "DOCKERD_ROOTLESS_ROOTLESSKIT_PORT_DRIVER": "none"}
        with log.open("wb") as sink:
            process = subprocess.Popen(docker.argv(str(DOCKERD_ROOTLESS), env=env),
                                       stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                       cwd=user.home, start_new_session=True)
        stack.callback(_stop, process)
        _wait_for_daemon(docker, process, log)
        pulled = docker.docker("pull", "-q", images["busybox"].ref)
        assert pulled.returncode == 0, pulled.stderr
        yield docker


def test_rootless_docker_runs_through_scrun_as_the_user(
        docker_user: RootlessDocker, ocistage: OcistageRunner,
        images: dict[str, ImageRef]) -> None:
    cluster, user = docker_user.cluster, docker_user.user
    _scrun_lua(cluster, ocistage, docker_user.stage_dir)
    cidfile = docker_user.runtime_dir / "cid"
    # the busybox image's entrypoint is `/bin/sh -c`: the command is one argument
    result = docker_user.docker(
        "run", "--rm", "--pull=never", f"--cidfile={cidfile}", *docker_run_flags(),
        images["busybox"].ref, "echo from-docker; id -u; grep ^NAME= /etc/os-release; exit 3")
    assert_engine_ran_the_job(result, "from-docker", cluster, user, cidfile)
    assert docker_user.staged() == []


# 26.05.3 never hands `scrun create` the pid after a failed stage-in (docs/slurm.md)
@pytest.mark.parametrize("slurm_nodes", ["24.05"], indirect=True)
def test_a_hook_that_cannot_run_ocistage_makes_docker_run_say_why(
        docker_user: RootlessDocker, ocistage: OcistageRunner,
        images: dict[str, ImageRef]) -> None:
    """containerd's shim reports a failed ``create`` with the last error of the runtime's
    log.json, where the generated Lua's ``scrun create`` wrote the hook's reason."""
    missing = "/nonexistent/bin/ocistage"
    _scrun_lua(docker_user.cluster, ocistage, docker_user.stage_dir, "--ocistage", missing)
    result = docker_user.docker("run", "--rm", "--pull=never", *docker_run_flags(),
                                images["busybox"].ref, "echo never")
    assert result.returncode != 0 and "never" not in result.stdout.splitlines()
    error = "OCI runtime create failed: ocistage scrun stage-in failed (exit 127): "
    assert error in result.stderr, result.stderr
    assert f"/bin/sh: 1: {missing}: not found" in result.stderr, result.stderr
    assert "--ocistage /absolute/path/of/ocistage" in result.stderr, result.stderr
    _no_jobs_of(docker_user.cluster, docker_user.user)
    assert docker_user.staged() == []
