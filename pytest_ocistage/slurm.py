"""Private Slurm clusters for the end-to-end tests, started on demand and stopped by pid.

Two clusters, both made by :func:`running_cluster` and handed to tests as a
:class:`SlurmCluster` by the session fixtures in ``tests/e2e/conftest.py``:

- ``slurm_22_05``: Debian 12's Slurm 22.05 (``/usr/sbin/slurmctld``), one node named after the
  host (``hostname -s``).
- ``slurm_24_05``: SchedMD's 24.05.8 built by ``.ci/build-slurm.sh`` into
  ``/opt/ocistage-slurm/<sha256 prefix of the tarball>`` (or ``$OCISTAGE_SLURM_PREFIX``), three
  nodes ``n1 n2 n3`` on this host (``NodeAddr=127.0.0.1``, a port each), with ``scrun``.

What to start is a :class:`~pytest_ocistage.clusterspec.ClusterSpec`
(:mod:`pytest_ocistage.clusterspec`); its ``slurm.conf`` and ``oci.conf`` come from
:mod:`pytest_ocistage.clusterconf`, the job user from :mod:`pytest_ocistage.jobuser`.

Nothing outside the cluster's own directory (``/tmp/ocistage-slurm-<name>-XXXX``, mode 0755 so
that job users reach it) is written, and nothing is left running:

- ``etc/``: ``slurm.conf`` (``SLURM_CONF``; the daemons get ``-f``), an empty ``mpi.conf``
  (24.05 keeps batch jobs PENDING with ``InvalidAccount`` without accounting unless it exists),
  ``plugstack.conf`` (empty, or ``ClusterSpec.plugstack``: pyxis for
  tests/e2e/test_pyxis_importer.py, whose spec also puts enroot first on the daemons' PATH and
  gives each slurmd a 0666 ``/dev/fuse`` of its own, ``user_fuse``) and ``oci.conf`` written
  by ``ocistage runtime oci-conf --runtime runc`` (its default runtime root: the step's spool
  directory, ``%m``, ``%b`` on 22.05; plus ``SrunPath`` from 23.02 on: scrun runs srun
  through ``sh`` with the job's environment, which has no PATH);
- ``munge/``: a private munged (own key, seed, pid and log; socket ``munge-socket/munge.socket``,
  given to Slurm as ``AuthInfo=socket=...``);
- ``state/``, ``spool/<node>/``, ``log/`` (``slurmctld.log``, ``slurmd-<node>.log``,
  ``munged.log``), ``run/`` (pid files);
- ``nodes/<node>/``: each node's backing directory of the node-local path ``local/``. Every
  slurmd is started with ``unshare --mount --propagation private`` and bind-mounts its
  ``nodes/<node>`` on ``local/`` before it execs, so each node (and every job step on it) sees
  only its own directory there while the host sees an empty ``local/``; a test checks what a node
  got in :meth:`SlurmCluster.node_dir`. On a host with a hybrid cgroup layout the 24.05
  nodes also unmount ``/sys/fs/cgroup/unified`` in their namespace, so they look like cgroup v1
  nodes: crun 1.8 refuses any container on a hybrid host whose cgroup2 part has a controller
  enabled (``cgroups in hybrid mode not supported``), whatever the bundle's config says.

The daemons run in the foreground as children of the test session (with ``PR_SET_PDEATHSIG``,
so even a killed session takes them along). At the end of the session every job is cancelled,
the slurmds are stopped by pid and every process still in a node's mount namespace (a
slurmstepd and its job) is killed, then slurmctld and munged, then the directory is removed.

When a cluster cannot be had (no ``slurmctld``, the 24.05 build missing, not root) the test is
skipped with the reason, or fails under ``OCISTAGE_REQUIRE_E2E=1``.

:class:`SlurmCluster` API (keep it stable: other tests build on it)::

    cluster.version        "22.05.8" / "24.05.8" (``slurmctld -V``)
    cluster.env            {"SLURM_CONF": ..., "PATH": its bin/ first}: add to a command's env
    cluster.environ(base)   base (default os.environ) with SLURM_CONF and PATH set for it
    cluster.export(monkeypatch)  the same for this process (in-process squeue calls)
    cluster.nodes          ("vm",) / ("n1", "n2", "n3")
    cluster.node_local     the node-local path (the same on every node)
    cluster.node_dirs      {node: backing directory on the host}; node_dir(node)
    cluster.bin_dir        where its srun, sbatch, salloc, scontrol (and scrun) are
    cluster.slurm_conf, cluster.oci_conf, cluster.log_dir
    cluster.run(*argv, user=, cwd=, env=, input=, timeout=, check=)   any command, env = the
                           environment to start from (e.g. ``ocistage.environment()``)
    cluster.srun(*args, ...), cluster.salloc(*args, ...)              CompletedProcess
    cluster.sbatch(*args, ...) -> job id (``--parsable``; fails the test if refused)
    cluster.scontrol(*args, ...)
    cluster.job_record(id), cluster.wait_for_job(id), cluster.wait_until_gone_from_squeue(id)
    cluster.use_oci_conf(text)   context manager: another oci.conf for the steps started inside

``srun``/``sbatch``/``salloc`` add ``--time=5`` unless a ``--time`` is given. ``user`` is a
:class:`JobUser` (fixture ``slurm_job_user``): the command runs as that user with the cluster's
environment.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ocistage.runtimes.slurm import parse_scontrol_record
from pytest_ocistage.clusterconf import oci_conf, slurm_conf
from pytest_ocistage.clusterspec import (
    HYBRID_CGROUP2,
    ClusterError,
    ClusterSpec,
    check_spec,
    hybrid_cgroup2,
)
from pytest_ocistage.components import (
    component_unavailable,
    die_with_parent,
    free_port,
    require_root,
    stop_process,
)
from pytest_ocistage.jobuser import JobUser

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
START_TIMEOUT = 90.0
STOP_TIMEOUT = 15.0




# --- the cluster as tests see it --------------------------------------------------------------

@dataclass(frozen=True)
class SlurmCluster:
    """A running private Slurm cluster (see the module docstring)."""

    name: str
    version: str
    base: Path
    bin_dir: Path
    sbin_dir: Path
    nodes: tuple[str, ...]
    node_local: Path
    node_dirs: Mapping[str, Path]
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def conf_dir(self) -> Path:
        return self.base / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.conf_dir / "slurm.conf"

    @property
    def oci_conf(self) -> Path:
        return self.conf_dir / "oci.conf"

    @property
    def log_dir(self) -> Path:
        return self.base / "log"

    def node_dir(self, node: str) -> Path:
        """The host directory that node ``node`` sees at :attr:`node_local`."""
        return self.node_dirs[node]

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """base (default: this process's environment) with the cluster's ``SLURM_CONF`` and
        its bin directory first on ``PATH`` on top."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = self.env["SLURM_CONF"]
        env["PATH"] = os.pathsep.join([str(self.bin_dir), str(self.sbin_dir),
                                       env.get("PATH", "/usr/bin:/bin")])
        return env

    def export(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point this test process's own Slurm calls (``squeue`` in ocistage.cache.leases, say) at
        the
        cluster until the test ends."""
        for key, value in self.environ().items():
            if key in ("SLURM_CONF", "PATH"):
                monkeypatch.setenv(key, value)

    def command(self, *argv: str, user: JobUser | None = None) -> list[str]:
        """argv run with the cluster's environment, as ``user`` if given (runuser resets
        little, but the environment is passed explicitly so that nothing depends on it)."""
        if user is None:
            return list(argv)
        pairs = [f"{key}={value}" for key, value in sorted(self.env.items())]
        return user.argv("env", *pairs, *argv)

    def run(self, *argv: str, user: JobUser | None = None, cwd: Path | None = None,
            env: Mapping[str, str] | None = None, input: str | None = None,
            timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a command (a Slurm command, or anything that calls one) against this cluster;
        env is the environment to start from (default: this process's), see :meth:`environ`."""
        result = subprocess.run(self.command(*argv, user=user), capture_output=True,
                                text=True, timeout=timeout, check=False, cwd=cwd,
                                env=self.environ(env), input=input,
                                stdin=None if input is not None else subprocess.DEVNULL)
        if check and result.returncode != 0:
            pytest.fail(f"{' '.join(argv)} exited {result.returncode} on Slurm {self.version}:"
                        f"\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}", pytrace=False)
        return result

    def srun(self, *args: str, **options: object) -> subprocess.CompletedProcess[str]:
        return self.run("srun", *_with_time(args), **options)  # type: ignore[arg-type]

    def salloc(self, *args: str, **options: object) -> subprocess.CompletedProcess[str]:
        return self.run("salloc", *_with_time(args), **options)  # type: ignore[arg-type]

    def scontrol(self, *args: str, **options: object) -> subprocess.CompletedProcess[str]:
        return self.run("scontrol", *args, **options)  # type: ignore[arg-type]

    def sbatch(self, *args: str, **options: object) -> str:
        """Submit a batch job; its id (the test fails if sbatch refuses)."""
        result = self.run("sbatch", "--parsable", *_with_time(args),
                          **options)  # type: ignore[arg-type]
        job_id = result.stdout.strip().split(";")[0]
        if result.returncode != 0 or not job_id.isdigit():
            pytest.fail(f"sbatch {' '.join(args)} failed on Slurm {self.version}: "
                        f"{result.stdout}{result.stderr}", pytrace=False)
        return job_id

    def job_record(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o ID`` as a dict; {} once the job is purged."""
        result = self.scontrol("show", "job", "-o", job_id, timeout=30)
        if result.returncode != 0:
            return {}
        return parse_scontrol_record(result.stdout)

    def wait_for_job(self, job_id: str, timeout: float = 120) -> dict[str, str]:
        """Wait until the job has finished; its last ``scontrol show job`` record."""
        deadline = time.monotonic() + timeout
        record: dict[str, str] = {}
        while time.monotonic() < deadline:
            current = self.job_record(job_id)
            if current:
                record = current
            if record.get("JobState", "") in FINISHED:
                return record
            if not current and record:
                return record  # purged (MinJobAge) after we saw it
            time.sleep(0.3)
        pytest.fail(f"job {job_id} did not finish within {timeout}s: {record}", pytrace=False)

    def wait_until_gone_from_squeue(self, job_id: str, timeout: float = 60) -> None:
        """Wait until squeue no longer lists the job as active (what lease liveness checks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.run("squeue", "-h", "-j", job_id, "-o", "%T", timeout=30)
            if result.returncode != 0 or not result.stdout.strip():
                return
            time.sleep(0.3)
        pytest.fail(f"job {job_id} still in squeue after {timeout}s", pytrace=False)

    @contextmanager
    def use_oci_conf(self, text: str) -> Iterator[Path]:
        """Replace oci.conf (slurmstepd reads it for every step) until the block ends."""
        saved = self.oci_conf.read_text()
        _write_atomically(self.oci_conf, text)
        try:
            yield self.oci_conf
        finally:
            _write_atomically(self.oci_conf, saved)


def _with_time(args: Sequence[str]) -> list[str]:
    if any(arg == "-t" or arg.startswith(("--time", "-t")) for arg in args):
        return list(args)
    return ["--time=5", *args]


def _write_atomically(path: Path, text: str) -> None:
    scratch = path.with_name(f".{path.name}.new")
    scratch.write_text(text)
    scratch.chmod(0o644)
    scratch.replace(path)


def read_output(path: Path, timeout: float = 20) -> str:
    """A job's output file (it may appear a moment after the job is reported finished)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        time.sleep(0.2)
    pytest.fail(f"job output {path} never appeared", pytrace=False)


# --- starting and stopping --------------------------------------------------------------------

def _daemon_preexec() -> None:
    """Dies with the session (``die_with_parent``) and dumps no core: slurmd raises its soft
    core limit to the hard one, and a crashing slurmstepd, its child, would write ``core``
    into the job's working directory, the checkout the tests run from (a 22.05 step did)."""
    die_with_parent()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _start(argv: Sequence[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True, preexec_fn=_daemon_preexec)


def _mount_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _kill_namespace(namespace: str) -> None:
    """SIGKILL every process in a node's mount namespace (slurmstepds and their jobs)."""
    for _attempt in range(20):
        found = False
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _mount_namespace(int(entry)) == namespace:
                found = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), signal.SIGKILL)
        if not found:
            return
        time.sleep(0.1)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return f"--- {path.name}:\n" + "\n".join(text[-lines:]) + "\n"


def _version(spec: ClusterSpec) -> str:
    result = subprocess.run([str(spec.sbin_dir / "slurmctld"), "-V"], capture_output=True,
                            text=True, timeout=30, check=False, stdin=subprocess.DEVNULL)
    match = re.search(r"(\d+\.\d+\.\d+)", result.stdout)
    if match is None:
        raise ClusterError(f"slurmctld -V printed {result.stdout!r} {result.stderr!r}")
    return match.group(1)


def _wait_for_munge(socket_path: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ClusterError(f"munged exited with {process.returncode}\n{_tail(log)}")
        if socket_path.exists():
            encoded = subprocess.run(["munge", "-S", str(socket_path), "-n"],
                                     capture_output=True, timeout=10, check=False)
            if encoded.returncode == 0:
                decoded = subprocess.run(["unmunge", "-S", str(socket_path)],
                                         input=encoded.stdout, capture_output=True,
                                         timeout=10, check=False)
                if decoded.returncode == 0:
                    return
        time.sleep(0.1)
    raise ClusterError(f"munged did not answer on {socket_path}\n{_tail(log)}")


def _wait_idle(cluster: SlurmCluster, daemons: Sequence[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        for process in daemons:
            if process.poll() is not None:
                raise ClusterError(f"{process.args!r} exited with {process.returncode}")
        result = cluster.run("sinfo", "-h", "-N", "-o", "%N %T", timeout=30)
        if result.returncode == 0:
            states = dict(line.split(None, 1) for line in result.stdout.splitlines()
                          if " " in line)
            if all(states.get(node, "").startswith("idle") for node in cluster.nodes):
                return
            for node, state in states.items():
                if state.startswith(("down", "drain")):
                    cluster.scontrol("update", f"NodeName={node}", "State=RESUME", timeout=30)
        time.sleep(0.5)
    raise ClusterError(f"nodes of {cluster.name} did not become idle: {states}")


def _cancel_all_jobs(cluster: SlurmCluster) -> None:
    result = cluster.run("squeue", "-h", "-o", "%A", timeout=30)
    jobs = result.stdout.split() if result.returncode == 0 else []
    if not jobs:
        return
    cluster.run("scancel", *jobs, timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        result = cluster.run("squeue", "-h", "-o", "%A", timeout=30)
        if result.returncode != 0 or not result.stdout.strip():
            return
        time.sleep(0.3)


@contextmanager
def running_cluster(spec: ClusterSpec, ocistage: Sequence[str]) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and one slurmd per node; stop them all by pid on exit.

    ``ocistage`` is the command that writes oci.conf (``ocistage runtime oci-conf``).
    Raises :class:`ClusterError` (with the ends of the logs) if the cluster does not come up.
    """
    host = socket.gethostname().split(".")[0]
    nodes = (host,) if spec.node_count == 1 else tuple(
        f"n{index}" for index in range(1, spec.node_count + 1))
    version = _version(spec)
    base = Path(tempfile.mkdtemp(prefix=f"ocistage-slurm-{spec.name}-", dir="/tmp"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        base.chmod(0o755)
        for sub, mode in (("etc", 0o755), ("munge", 0o700), ("munge-socket", 0o755),
                          ("state", 0o700), ("spool", 0o755), ("log", 0o755), ("run", 0o755),
                          ("nodes", 0o755), ("local", 0o755)):
            (base / sub).mkdir(mode=mode)
            (base / sub).chmod(mode)
        node_dirs = {}
        for node in nodes:
            (base / "spool" / node).mkdir(mode=0o755)
            node_dirs[node] = base / "nodes" / node
            node_dirs[node].mkdir(mode=0o755)
            node_dirs[node].chmod(0o1777)  # like /tmp or a scratch mount: every user writes
        conf = base / "etc" / "slurm.conf"
        env = {"SLURM_CONF": str(conf),
               "PATH": os.pathsep.join([str(spec.bin_dir), str(spec.sbin_dir),
                                        os.environ.get("PATH", "/usr/bin:/bin")])}
        cluster = SlurmCluster(name=spec.name, version=version, base=base,
                               bin_dir=spec.bin_dir, sbin_dir=spec.sbin_dir, nodes=nodes,
                               node_local=base / "local", node_dirs=node_dirs, env=env)
        daemon_env = cluster.environ()
        daemon_env["PATH"] = os.pathsep.join([*spec.daemon_path, daemon_env["PATH"]])

        key = base / "munge" / "munge.key"
        with key.open("wb") as out:
            out.write(os.urandom(1024))
        key.chmod(0o400)
        munge_socket = base / "munge-socket" / "munge.socket"
        munge_log = base / "log" / "munged.log"
        munged = _start(["munged", "-F", f"--socket={munge_socket}",
                         f"--key-file={key}", f"--pid-file={base / 'run' / 'munged.pid'}",
                         f"--seed-file={base / 'munge' / 'munged.seed'}",
                         f"--log-file={munge_log}"], base / "log" / "munged.out", daemon_env)
        stack.callback(stop_process, munged)
        _wait_for_munge(munge_socket, munged, munge_log)

        ports = {node: free_port() for node in nodes}
        conf.write_text(slurm_conf(spec, base, host, nodes, ports))
        (base / "etc" / "mpi.conf").write_text("")
        (base / "etc" / "plugstack.conf").write_text(spec.plugstack)
        cluster.oci_conf.write_text(oci_conf(spec, base, version, ocistage, daemon_env))
        for path in base.joinpath("etc").iterdir():
            path.chmod(0o644)

        try:
            slurmctld = _start([str(spec.sbin_dir / "slurmctld"), "-D", "-c", "-i", "-f",
                                str(conf)], base / "log" / "slurmctld.out", daemon_env)
            stack.callback(stop_process, slurmctld)
            slurmds = []
            hide = HYBRID_CGROUP2 if spec.legacy_cgroups and hybrid_cgroup2() else ""
            for node in nodes:
                slurmd = _start(_slurmd_argv(spec, cluster, node, hide),
                                base / "log" / f"slurmd-{node}.out", daemon_env)
                slurmds.append(slurmd)
            stack.callback(_stop_slurmds, slurmds)
            stack.callback(_cancel_all_jobs, cluster)
            _wait_idle(cluster, [munged, slurmctld, *slurmds])
        except ClusterError as exc:
            logs = "".join(_tail(path) for path in sorted((base / "log").iterdir()))
            raise ClusterError(f"{exc}\n{logs}") from exc
        yield cluster


def _slurmd_argv(spec: ClusterSpec, cluster: SlurmCluster, node: str, hide: str) -> list[str]:
    """slurmd of ``node`` in a mount namespace of its own: node_local is its directory, and
    only there; ``hide`` (a hybrid host's cgroup2 mount) is unmounted there; with
    ``spec.user_fuse`` a 0666 /dev/fuse of its own is bind-mounted over the host's; with
    ``spec.site_config`` its /etc is an overlay holding that ``ocistage/config.toml``."""
    fuse = ""
    if spec.user_fuse:
        fuse = str(cluster.base / "fuse" / node)
        Path(fuse).mkdir(parents=True, mode=0o755)
    etc = ""
    if spec.site_config:  # an overlay of /etc per node (an upper directory is one mount's)
        etc = str(cluster.base / "etc-overlay" / node)
        (Path(etc) / "upper" / "ocistage").mkdir(parents=True, mode=0o755)
        (Path(etc) / "work").mkdir(mode=0o755)
        (Path(etc) / "upper" / "ocistage" / "config.toml").write_text(spec.site_config)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-ec",
            'mount --bind "$1" "$2"; if [ -n "$3" ]; then umount -l "$3"; fi; '
            'if [ -n "$4" ]; then mount -t tmpfs -o mode=0755 fuse "$4"; '
            'mknod -m 0666 "$4/fuse" c 10 229; mount --bind "$4/fuse" /dev/fuse; fi; '
            'if [ -n "$5" ]; then mount -t overlay overlay '
            '-o "lowerdir=/etc,upperdir=$5/upper,workdir=$5/work" /etc; fi; '
            'shift 5; exec "$@"', "slurmd-" + node,
            str(cluster.node_dir(node)), str(cluster.node_local), hide, fuse, etc,
            str(spec.sbin_dir / "slurmd"), "-D", "-c", "-f", str(cluster.slurm_conf), "-N", node]


def _stop_slurmds(slurmds: Sequence[subprocess.Popen[bytes]]) -> None:
    namespaces = {ns for ns in (_mount_namespace(p.pid) for p in slurmds) if ns is not None}
    namespaces.discard(_mount_namespace(os.getpid()))  # never our own
    for process in slurmds:
        stop_process(process, STOP_TIMEOUT)
    for namespace in namespaces:
        _kill_namespace(namespace)


@contextmanager
def session_cluster(spec: ClusterSpec, ocistage: Sequence[str]) -> Iterator[SlurmCluster]:
    """:func:`running_cluster`, or skip (fail under OCISTAGE_REQUIRE_E2E=1) with the reason."""
    require_root()  # slurmd runs jobs as their users
    problem = check_spec(spec)
    if problem is not None:
        component_unavailable(f"no Slurm {spec.name} cluster: {problem}")
    with ExitStack() as stack:
        try:
            cluster = stack.enter_context(running_cluster(spec, ocistage))
        except ClusterError as exc:
            component_unavailable(f"Slurm cluster {spec.name} did not start:\n{exc}")
        yield cluster
