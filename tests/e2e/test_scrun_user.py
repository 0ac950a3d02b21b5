"""Podman through scrun as it is meant to run: rootless, as an unprivileged user with its own
storage (subuid/subgid ranges, a private XDG_RUNTIME_DIR), on each three-node cluster
(``slurm_nodes``), with exactly the files ocistage writes and nothing fixing them up:

- scrun.lua (a site's ``/etc/slurm/scrun.lua``; here beside the cluster's slurm.conf, which
  sits where the cluster's Slurm looks by default) is ``ocistage runtime scrun-lua
  --stage-to node-local`` as root runs it: its hooks name this ocistage by absolute path
  (scrun runs them with conmon's PATH) and run through srun, outside Podman's user namespace
  (in it, root's directories show as nobody, so stage-in refuses: ``--stage-to shared``);
- ``~/.config/containers/containers.conf`` is ``ocistage runtime podman-config`` as the user
  runs it.

The hooks run as the user with whatever HOME scrun got; the user's own cache (under their
home) holds the leases, and nothing is left staged. A scrun.lua naming an ocistage that does
not exist makes ``podman run`` fail with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from ocistage.cache.leases import all_leases
from pytest_ocistage.components import require_binary
from pytest_ocistage.images import OS_RELEASE_NAME, ImageRef
from pytest_ocistage.jobuser import JobUser
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner

pytestmark = pytest.mark.timeout(900)
SUBID_COUNT = 65536


def _subid_ranges(path: Path) -> list[tuple[str, int, int]]:
    if not path.exists():
        return []
    ranges = []
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        start, _, count = rest.partition(":")
        if start.isdigit() and count.isdigit():
            ranges.append((name, int(start), int(count)))
    return ranges


@pytest.fixture
def subids(slurm_job_user: JobUser) -> Iterator[None]:
    """subuid and subgid ranges for the job user (rootless Podman's user namespace): a range
    the user has already is used as it is; one added here is removed again."""
    require_binary("usermod")
    require_binary("newuidmap")
    added = []
    for kind in ("uid", "gid"):
        path = Path(f"/etc/sub{kind}")
        ranges = _subid_ranges(path)
        if any(name in (slurm_job_user.name, str(slurm_job_user.uid))
               for name, _, _ in ranges):
            continue
        start = max([100000, *(first + count for _, first, count in ranges)])
        span = f"{start}-{start + SUBID_COUNT - 1}"
        subprocess.run(["usermod", f"--add-sub{kind}s", span, slurm_job_user.name],
                       check=True, capture_output=True, timeout=60)
        added.append((kind, span))
    try:
        yield
    finally:
        for kind, span in added:
            subprocess.run(["usermod", f"--del-sub{kind}s", span, slurm_job_user.name],
                           check=False, capture_output=True, timeout=60)


@dataclass(frozen=True)
class RootlessEngine:
    """An ordinary user of a cluster with a rootless container engine (Podman, Docker)."""

    cluster: SlurmCluster
    user: JobUser
    runtime_dir: Path     # the user's XDG_RUNTIME_DIR
    stage_dir: Path       # scrun.lua's STAGE_DIR (node-local)

    def env(self) -> dict[str, str]:
        """A login shell's environment: the user's Slurm on PATH, nothing of ours."""
        return {"HOME": str(self.user.home), "USER": self.user.name,
                "LOGNAME": self.user.name, "XDG_RUNTIME_DIR": str(self.runtime_dir),
                "PATH": f"{self.cluster.bin_dir}:/usr/local/bin:/usr/bin:/bin",
                "LANG": "C.UTF-8"}

    def argv(self, *command: str, env: dict[str, str] | None = None) -> list[str]:
        pairs = [f"{key}={value}" for key, value in (env or self.env()).items()]
        return self.user.argv("env", "-i", *pairs, *command)

    def run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(self.argv(*argv), capture_output=True, text=True,
                                  timeout=timeout, cwd=self.user.home, check=False,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{' '.join(argv)} still running after {timeout:.0f}s; its output: "
                        f"{exc.stdout!r} {exc.stderr!r}\n{cluster_report(self.cluster)}")

    def staged(self) -> list[Path]:
        """The bundles staged on any node (in STAGE_DIR/UID, or STAGE_DIR-UID beside it)."""
        relative = self.stage_dir.relative_to(self.cluster.node_local)
        found = []
        for node in self.cluster.nodes:
            base = self.cluster.node_dir(node) / relative
            beside = base.with_name(f"{base.name}-{self.user.uid}")
            for place in (base / str(self.user.uid), beside):
                found += list(place.iterdir()) if place.is_dir() else []
        return found


@dataclass(frozen=True)
class RootlessPodman(RootlessEngine):
    podman_path: str

    def podman(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(self.podman_path, *args)


def cluster_report(cluster: SlurmCluster, lines: int = 30) -> str:
    """What a test that waited in vain saw of the cluster: the queue, every job's record, and
    the end of each daemon's log."""
    parts = []
    for argv in (("squeue", "-a"), ("scontrol", "show", "job", "-o")):
        try:
            result = cluster.run(*argv, timeout=30)
            parts.append(f"--- {' '.join(argv)}:\n{result.stdout}{result.stderr}")
        except subprocess.TimeoutExpired:
            parts.append(f"--- {' '.join(argv)}: no answer in 30 s")
    for log in sorted(path for path in cluster.log_dir.iterdir() if path.is_file()):
        text = log.read_text(errors="replace").splitlines()
        parts.append(f"--- {log.name}:\n" + "\n".join(text[-lines:]))
    return "\n".join(parts)


def _write_as(user: JobUser, path: Path, text: str) -> None:
    """``text`` into ``path`` below the user's home, made as the user would."""
    for parent in reversed(path.relative_to(user.home).parents):
        directory = user.home / parent
        if not directory.exists():
            directory.mkdir(mode=0o700)
            os.chown(directory, user.uid, user.gid)
    path.write_text(text)
    os.chown(path, user.uid, user.gid)


def _scrun_lua(cluster: SlurmCluster, ocistage: OcistageRunner, stage_dir: Path,
               *options: str) -> Path:
    """``ocistage runtime scrun-lua`` as the admin runs it, installed where scrun reads it."""
    result = ocistage("runtime", "scrun-lua", "--stage-to", "node-local", "--stage-dir",
                      str(stage_dir), *options, env=cluster.environ(ocistage.environment()),
                      check=True)
    script = cluster.conf_dir / "scrun.lua"
    script.write_text(result.stdout)
    return script


@contextmanager
def site_slurm_conf(cluster: SlurmCluster) -> Iterator[None]:
    """The cluster's configuration where its Slurm looks by default (``PREFIX/etc``), as a
    site's is: Podman runs ``scrun start``, ``state``, ``kill`` and ``delete`` with nothing but
    XDG_RUNTIME_DIR and PATH, and the srun scrun starts gets the job's environment, so no
    SLURM_CONF can reach them."""
    default = cluster.bin_dir.parent / "etc"
    if os.path.lexists(default):
        pytest.fail(f"{default} exists: the test cluster's configuration cannot go there")
    default.symlink_to(cluster.conf_dir)
    try:
        yield
    finally:
        default.unlink()


@contextmanager
def users_file(path: Path, text: str, user: JobUser) -> Iterator[None]:
    """``text`` in ``path`` below the user's home for a while (what was there is restored)."""
    saved = path.read_bytes() if path.exists() else None
    _write_as(user, path, text)
    try:
        yield
    finally:
        if saved is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(saved)


def user_runtime_dir(stack: ExitStack, user: JobUser, prefix: str) -> Path:
    """A new XDG_RUNTIME_DIR of the user's, removed when ``stack`` closes. In /tmp: the
    engines' sockets live there, and a socket's path must stay short."""
    runtime_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    stack.callback(shutil.rmtree, runtime_dir, ignore_errors=True)
    os.chown(runtime_dir, user.uid, user.gid)
    return runtime_dir


@pytest.fixture
def podman_user(slurm_nodes: SlurmCluster, slurm_job_user: JobUser, subids: None,
                ocistage: OcistageRunner,
                images: dict[str, ImageRef]) -> Iterator[RootlessPodman]:
    cluster, user = slurm_nodes, slurm_job_user
    podman = require_binary("podman")
    if not (cluster.bin_dir / "scrun").exists():
        require_binary(f"scrun-of-the-{cluster.version}-build")
    with ExitStack() as stack:
        runtime_dir = user_runtime_dir(stack, user, "ocs-xdg-")
        rootless = RootlessPodman(cluster, user, runtime_dir,
                                  cluster.node_local / "ocistage-scrun", podman)
        config = ocistage("runtime", "podman-config", env=rootless.env(), check=True)
        stack.enter_context(site_slurm_conf(cluster))
        stack.callback((cluster.conf_dir / "scrun.lua").unlink, missing_ok=True)
        stack.enter_context(users_file(
            user.home / ".config" / "containers" / "containers.conf", config.stdout, user))
        # the user's storage and Podman's pause process go (userdel refuses a user's process)
        stack.callback(rootless.podman, "system", "reset", "--force")
        pulled = rootless.podman("pull", "-q", "--tls-verify=false", images["busybox"].ref)
        assert pulled.returncode == 0, pulled.stderr
        yield rootless


def _no_cleanup_jobs(cluster: SlurmCluster, timeout: float = 120) -> None:
    """Wait until no bundle's cleanup job is queued (stage-out cancels it)."""
    deadline = time.monotonic() + timeout
    while True:
        queue = cluster.run("squeue", "-h", "-o", "%j", timeout=30).stdout.split()
        if not any(name.startswith("ocistage-scrun-unstage-") for name in queue):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"cleanup jobs still queued: {queue}")
        time.sleep(1)


def test_rootless_podman_runs_through_scrun_as_the_user(
        podman_user: RootlessPodman, ocistage: OcistageRunner,
        images: dict[str, ImageRef]) -> None:
    cluster, user = podman_user.cluster, podman_user.user
    _scrun_lua(cluster, ocistage, podman_user.stage_dir)
    cidfile = podman_user.runtime_dir / "cid"
    # the busybox image's entrypoint is `/bin/sh -c`: the command is one argument
    result = podman_user.podman("run", "--rm", "--pull=never", f"--cidfile={cidfile}",
                                images["busybox"].ref,
                                "echo from-podman; id -u; grep ^NAME= /etc/os-release; exit 3")
    assert_engine_ran_the_job(result, "from-podman", cluster, user, cidfile)
    assert podman_user.staged() == []


def assert_engine_ran_the_job(result: subprocess.CompletedProcess[str], greeting: str,
                              cluster: SlurmCluster, user: JobUser, cidfile: Path) -> None:
    """``podman run``/``docker run`` of ``echo GREETING; id -u; grep ^NAME= /etc/os-release;
    exit 3`` in busybox went through scrun: its output, its status, and the job behind it
    (:func:`assert_job_ran_as_the_user`; shared by the Podman and Docker tests)."""
    lines = result.stdout.splitlines()
    # container root, which is the user outside
    assert lines[:2] == [greeting, "0"], result.stderr
    assert f'NAME="{OS_RELEASE_NAME}"' in lines, result.stderr
    # where the exit code goes: scrun hands srun's status to Slurm (the job's ExitCode), but
    # its anchor process, whose status conmon (or containerd's shim) reports to the engine,
    # exits 0
    assert result.returncode == 0, result.stderr
    assert "task 0: Exited with exit code 3" in result.stderr
    assert_job_ran_as_the_user(cluster, user, cidfile.read_text().strip())


def assert_job_ran_as_the_user(cluster: SlurmCluster, user: JobUser, container_id: str) -> None:
    """The engine's container was the user's job, which exited 3, and its stage-in and
    stage-out ran as the user, with the user's own settings and cache, leaving no lease and
    no cleanup job behind (the last part of :func:`assert_engine_ran_the_job`)."""
    jobs = cluster.scontrol("show", "job", "-o", timeout=30).stdout.splitlines()
    [job] = [job for job in jobs if f" ContainerID={container_id}" in job]
    assert f" UserId={user.name}({user.uid}) " in job, job
    assert " ExitCode=3:0 " in job and " JobState=FAILED " in job, job
    cache = user.home / ".cache" / "ocistage"
    assert cache.is_dir() and cache.stat().st_uid == user.uid
    assert all_leases(cache) == []
    _no_cleanup_jobs(cluster)


# 26.05.3: when stage-in fails, `scrun create` never gets the anchor's pid (stop_anchor queues
# it on the startup connection without the conmgr_unquiesce_fd that on_allocation calls), so
# create, and `podman run`, wait until Podman gives up (240 s); docs/slurm.md
@pytest.mark.parametrize("slurm_nodes", ["24.05"], indirect=True)
def test_a_hook_that_cannot_run_ocistage_makes_podman_run_say_why(
        podman_user: RootlessPodman, ocistage: OcistageRunner,
        images: dict[str, ImageRef]) -> None:
    missing = "/nonexistent/bin/ocistage"
    _scrun_lua(podman_user.cluster, ocistage, podman_user.stage_dir, "--ocistage", missing)
    try:
        result = podman_user.podman("run", "--name=nohook", "--pull=never",
                                    images["busybox"].ref, "echo never")
        # `scrun create` exits 1 with the reason in Podman's runtime log (oci-log, JSON:
        # containers.conf's runtime_supports_json), and Podman prints it
        assert result.returncode != 0 and "never" not in result.stdout.splitlines()
        error = "Error: OCI runtime error: slurm: ocistage scrun stage-in failed (exit 127): "
        assert error in result.stderr, result.stderr
        assert f"/bin/sh: 1: {missing}: not found" in result.stderr, result.stderr
        assert "--ocistage /absolute/path/of/ocistage" in result.stderr, result.stderr
    finally:
        podman_user.podman("rm", "--force", "nohook")
    # the anchor ended the job; nothing was staged or queued
    _no_jobs_of(podman_user.cluster, podman_user.user)
    assert podman_user.staged() == []


def _no_jobs_of(cluster: SlurmCluster, user: JobUser, timeout: float = 120) -> None:
    """Wait until the user has no job queued or running."""
    deadline = time.monotonic() + timeout
    while True:
        queue = cluster.run("squeue", "-h", "-u", user.name, "-o", "%i %j %T", timeout=30)
        if queue.returncode == 0 and not queue.stdout.strip():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"jobs of {user.name} still queued: {queue.stdout!r}")
        time.sleep(0.5)
