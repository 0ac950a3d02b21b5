"""ocistage-pyxis-importer under real pyxis 0.24.0 and enroot 4.1.2 (docs/pyxis.md).

enroot and pyxis come from ``.ci/build-enroot-pyxis.sh`` (built once per machine from
../shared/vendor); pyxis is loaded into a three-node Slurm 24.05 cluster of its own
(``required spank_pyxis.so importer=<installed importer> use_squashfuse=1``), whose slurmds
have enroot's bin on their PATH and a /dev/fuse of mode 0666 in their mount namespace. The
importer is the console script of this checkout's wheel installed into a venv under /tmp made
with Debian's /usr/bin/python3, so that the unprivileged job user can run it. These parts are
plain functions in pytest_ocistage/pyxiscluster.py, shared with ``python -m bench pyxisnodes``.

A wrapper named ``mksquashfs`` first on slurmd's PATH logs every build, so the test of three
nodes asking at once can count them. The oracle: the same image imported by ``enroot import``
(from a v2s2 copy: enroot 4.1.2 cannot read this registry's OCI manifests) and through the
importer give the same ``env``, ``pwd``, ``id`` and default command under ``enroot start``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ocistage.clusterspec import ClusterError
from pytest_ocistage.components import Registry, component_unavailable, require_root
from pytest_ocistage.images import FixtureLayouts, PushSpec, push_all
from pytest_ocistage.jobuser import JobUser
from pytest_ocistage.pyxiscluster import (
    SYSTEM_PYTHON,
    enroot_pyxis_prefix,
    installed_importer,
    job_export,
    logging_mksquashfs,
    mksquashfs_builds,
    pyxis_spec,
)
from pytest_ocistage.runner import ocistage_command
from pytest_ocistage.slurm import SlurmCluster, session_cluster

# the trust oracle's signed images, keys and lookaside (the admission test at the end)
from tests.e2e.test_trust_oracle import World, trust_files, world  # noqa: F401

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def enroot_pyxis() -> Path:
    """The prefix with enroot/ and pyxis/ (built now if this machine has none yet)."""
    require_root()  # the pyxis tests start a Slurm cluster and need root
    try:
        return enroot_pyxis_prefix()
    except ClusterError as exc:
        component_unavailable(str(exc))


@pytest.fixture(scope="module")
def importer() -> Iterator[Path]:
    """The installed ``ocistage-pyxis-importer`` in a venv every user can run."""
    if not SYSTEM_PYTHON.is_file():
        component_unavailable(f"{SYSTEM_PYTHON} is missing: the job user's venv is made with it")
    with installed_importer() as script:
        yield script


@pytest.fixture(scope="module")
def tools() -> Iterator[Path]:
    """A directory every user reaches, with a ``mksquashfs`` that logs its builds to
    ``builds.log`` and runs the real one."""
    if shutil.which("mksquashfs") is None:
        component_unavailable("mksquashfs is not installed (squashfs-tools)")
    with logging_mksquashfs() as base:
        yield base


@pytest.fixture(scope="module")
def pushed(oci_registry: Registry, fixture_layouts_built: FixtureLayouts,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The busybox fixture as OCI/gzip, OCI/zstd and Docker v2s2: enroot URIs (REG#REPO:TAG)."""
    specs = [PushSpec("oci", "busybox", oci_registry, "pyxis/busybox", "oci"),
             PushSpec("zstd", "busybox-zstd", oci_registry, "pyxis/busybox", "zstd"),
             PushSpec("v2s2", "busybox", oci_registry, "pyxis/busybox", "v2s2",
                      ("--format", "v2s2"))]
    refs = push_all(specs, fixture_layouts_built, tmp_path_factory.mktemp("pyxis-push"))
    return {name: f"{oci_registry.host}#pyxis/busybox:{ref.tag}" for name, ref in refs.items()}


@pytest.fixture(scope="module")
def pyxis_cluster(enroot_pyxis: Path, importer: Path, tools: Path) -> Iterator[SlurmCluster]:
    with session_cluster(pyxis_spec("pyxis2405", enroot_pyxis, importer, tools),
                         ocistage_command()) as cluster:
        yield cluster


@pytest.fixture
def job_dirs(slurm_job_user: JobUser) -> Iterator[dict[str, Path]]:
    """Per-test caches: root's and the job user's (XDG dirs enroot uses, the ocistage cache)."""
    base = Path(tempfile.mkdtemp(prefix="ocistage-pyxis-job-", dir="/tmp"))
    base.chmod(0o755)
    dirs = {}
    for who, uid, gid in (("root", 0, 0), ("user", slurm_job_user.uid, slurm_job_user.gid)):
        dirs[who] = base / who
        dirs[who].mkdir(mode=0o700)
        os.chown(dirs[who], uid, gid)
    yield dirs
    shutil.rmtree(base, ignore_errors=True)


_export = job_export


def _logs(cluster: SlurmCluster) -> str:
    """The ends of the slurmd logs (pyxis logs there), for a failure's message."""
    return "".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
                   + "\n" for p in sorted(cluster.log_dir.glob("slurmd-*.log")))


_builds = mksquashfs_builds


def _pyxis_leases(cache: Path) -> list[str]:
    leases = cache / "leases"
    return sorted(p.name for p in leases.glob("pyxis-*")) if leases.is_dir() else []


SHOW = "id -u; pwd; cat /etc/environment; echo rc=$(head -c 40 /etc/rc.local)"


def test_three_nodes_at_once_build_once(pyxis_cluster: SlurmCluster, pushed: dict[str, str],
                                        tools: Path, job_dirs: dict[str, Path]) -> None:
    before = len(_builds(tools))
    result = pyxis_cluster.srun(
        "-N3", "--ntasks-per-node=1", _export(job_dirs["root"], 0),
        f"--container-image={pushed['oci']}", "sh", "-c", SHOW, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr + _logs(pyxis_cluster)
    outputs = result.stdout.split("rc=")
    assert len(outputs) == 4, result.stdout
    assert result.stdout.splitlines().count("0") == 3
    assert len(_builds(tools)) == before + 1, _builds(tools)
    images = list((job_dirs["root"] / "cache" / "pyxis").glob("*.sqsh"))
    assert len(images) == 1
    assert _pyxis_leases(job_dirs["root"] / "cache") == []  # released at the end of the step


def test_unprivileged_user_with_a_zstd_image(pyxis_cluster: SlurmCluster,
                                             pushed: dict[str, str], tools: Path,
                                             job_dirs: dict[str, Path],
                                             slurm_job_user: JobUser) -> None:
    home = job_dirs["user"]
    result = pyxis_cluster.srun(
        "-N3", "--ntasks-per-node=1", _export(home, slurm_job_user.uid),
        f"--container-image={pushed['zstd']}", "sh", "-c", SHOW, user=slurm_job_user,
        cwd=Path("/tmp"), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr + _logs(pyxis_cluster)
    assert result.stdout.splitlines().count(str(slurm_job_user.uid)) == 3
    images = list((home / "cache" / "pyxis").glob("*.sqsh"))
    assert len(images) == 1 and images[0].stat().st_uid == slurm_job_user.uid
    assert _pyxis_leases(home / "cache") == []


def test_container_name_releases_twice(pyxis_cluster: SlurmCluster, pushed: dict[str, str],
                                       job_dirs: dict[str, Path]) -> None:
    for _run in range(2):
        result = pyxis_cluster.srun(
            "-N1", _export(job_dirs["root"], 0), f"--container-image={pushed['oci']}",
            "--container-name=ocistage-pyxis-named", "sh", "-c", "cat /etc/rc",
            timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr + _logs(pyxis_cluster)
        assert 'cd "/home/app" && unset OLDPWD' in result.stdout  # enroot's rc: WorkingDir
    logs = "".join(p.read_text(errors="replace")
                   for p in pyxis_cluster.log_dir.glob("slurmd-*.log"))
    assert "importer release" not in logs.replace("running importer command", ""), logs[-3000:]
    assert _pyxis_leases(job_dirs["root"] / "cache") == []


def test_failed_get_reaches_srun(pyxis_cluster: SlurmCluster, pushed: dict[str, str],
                                 job_dirs: dict[str, Path]) -> None:
    registry = pushed["oci"].split("#")[0]
    result = pyxis_cluster.srun(
        "-N1", _export(job_dirs["root"], 0), f"--container-image={registry}#pyxis/nope:1",
        "true", timeout=600)
    assert result.returncode != 0
    assert "error: " in result.stderr and "not found" in result.stderr, result.stderr
    assert "hint: " in result.stderr
    assert not list((job_dirs["root"] / "cache" / "tmp").iterdir())
    assert _pyxis_leases(job_dirs["root"] / "cache") == []


def _enroot_env(prefix: Path, home: Path) -> dict[str, str]:
    for sub in ("run", "cache", "data", "config"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    return {"PATH": f"{prefix / 'enroot' / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home), "ENROOT_RUNTIME_PATH": str(home / "run"),
            "ENROOT_CACHE_PATH": str(home / "cache"), "ENROOT_DATA_PATH": str(home / "data"),
            "ENROOT_CONFIG_PATH": str(home / "config"), "ENROOT_ALLOW_HTTP": "y",
            "ENROOT_TEMP_PATH": str(home), "OCISTAGE_CACHE": str(home / "ocistage")}


def _start(env: dict[str, str], name: str, *command: str) -> str:
    result = subprocess.run(["enroot", "start", name, *command], capture_output=True,
                            text=True, env=env, timeout=120, check=False,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_same_as_enroot_import(enroot_pyxis: Path, importer: Path, pushed: dict[str, str],
                               tmp_path: Path) -> None:
    env = _enroot_env(enroot_pyxis, tmp_path)
    reference = tmp_path / "enroot-import.sqsh"
    imported = subprocess.run(["enroot", "import", "-o", str(reference),
                               f"docker://{pushed['v2s2']}"], capture_output=True, text=True,
                              env=env, timeout=600, check=False, stdin=subprocess.DEVNULL)
    assert imported.returncode == 0, imported.stderr[-3000:]
    got = subprocess.run([str(importer), "get", f"docker://{pushed['oci']}"],
                         capture_output=True, text=True, env=env, timeout=600, check=False,
                         stdin=subprocess.DEVNULL)
    assert got.returncode == 0, got.stderr
    ours = Path(got.stdout.splitlines()[0])
    assert ours.is_absolute() and ours.is_file()
    shown = {}
    for name, image in (("ref", reference), ("ours", ours)):
        created = subprocess.run(["enroot", "create", "--name", name, str(image)],
                                 capture_output=True, text=True, env=env, timeout=300,
                                 check=False, stdin=subprocess.DEVNULL)
        assert created.returncode == 0, created.stderr
        shown[name] = (_start(env, name),
                       _start(env, name, "sh", "-c", "env | sort; pwd; id"))
    assert shown["ours"] == shown["ref"]
    assert "hello from busybox" in shown["ours"][0]
    for path in ("etc/rc", "etc/environment", "etc/fstab", "etc/rc.local"):
        files = [subprocess.run(["unsquashfs", "-cat", str(image), path], capture_output=True,
                                check=True).stdout for image in (reference, ours)]
        assert files[0] == files[1], path


def test_srun_container_image_runs_only_what_the_users_policy_admits(
        pyxis_cluster: SlurmCluster, world: World, job_dirs: dict[str, Path],  # noqa: F811
        slurm_job_user: JobUser) -> None:
    """Image trust through pyxis (docs/trust.md): the job user's policy, named by their config
    file, admits the image the site's key signed and refuses the unsigned one before anything
    is built; the refusal reaches srun as the importer's error."""
    home = job_dirs["user"]
    trust = home / "trust"
    policy, registries_d = trust_files(world, trust)
    (trust / "config.toml").write_text(f'policy = "{policy}"\nregistries_d = "{registries_d}"\n')
    for path in [trust, *trust.rglob("*")]:
        os.chown(path, slurm_job_user.uid, slurm_job_user.gid)
    export = _export(home, slurm_job_user.uid) + f",OCISTAGE_CONFIG={trust / 'config.toml'}"

    def srun(ref: str) -> subprocess.CompletedProcess[str]:
        return pyxis_cluster.srun("-N1", export, f"--container-image={ref.replace('/', '#', 1)}",
                                  "id", "-u", user=slurm_job_user, cwd=Path("/tmp"),
                                  timeout=600)

    refused = srun(world.ref("unsigned:1"))
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert f"{world.ref('unsigned:1')} is rejected by the policy {trust / 'policy.json'}" \
        in refused.stderr, refused.stderr + _logs(pyxis_cluster)
    assert not list((home / "cache" / "pyxis").glob("*.sqsh"))
    admitted = srun(world.ref("signed:1"))
    assert admitted.returncode == 0, admitted.stdout + admitted.stderr + _logs(pyxis_cluster)
    assert admitted.stdout.split() == [str(slurm_job_user.uid)]
    assert len(list((home / "cache" / "pyxis").glob("*.sqsh"))) == 1


@pytest.fixture(scope="module")
def site_trust(world: World) -> Iterator[Path]:  # noqa: F811
    """The site's trust files (policy, key, registries.d, lookaside), readable by job users."""
    base = Path(tempfile.mkdtemp(prefix="ocistage-pyxis-site-", dir="/tmp"))
    try:
        base.chmod(0o755)
        trust_files(world, base / "site")
        for path in [base, *base.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield base / "site"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def pyxis_site_cluster(enroot_pyxis: Path, importer: Path, tools: Path,
                       site_trust: Path) -> Iterator[SlurmCluster]:
    """The pyxis cluster, its nodes' site config making the site's image policy mandatory."""
    spec = pyxis_spec("pyxis2405site", enroot_pyxis, importer, tools, site_config=(
        f'policy_mandatory = true\npolicy = "{site_trust / "policy.json"}"\n'
        f'registries_d = "{site_trust / "registries.d"}"\n'))
    with session_cluster(spec, ocistage_command()) as cluster:
        yield cluster


def test_a_mandatory_site_policy_binds_srun_container_image_for_a_user(
        pyxis_site_cluster: SlurmCluster, world: World, site_trust: Path,  # noqa: F811
        job_dirs: dict[str, Path], slurm_job_user: JobUser) -> None:
    """DESIGN.md, "Image trust": with ``policy_mandatory`` in the nodes' site config, an
    ordinary user whose own policy file and config accept anything gets the unsigned image
    refused by the site's policy (and told that theirs is ignored) and the signed one run."""
    home = job_dirs["user"]
    accept = json.dumps({"default": [{"type": "insecureAcceptAnything"}]})
    (home / ".config" / "containers").mkdir(parents=True)
    (home / ".config" / "containers" / "policy.json").write_text(accept)
    (home / "accept.json").write_text(accept)
    (home / "config.toml").write_text(f'policy = "{home / "accept.json"}"\n')
    for path in [*home.rglob("*")]:
        os.chown(path, slurm_job_user.uid, slurm_job_user.gid)
    export = _export(home, slurm_job_user.uid) + f",OCISTAGE_CONFIG={home / 'config.toml'}"

    def srun(ref: str) -> subprocess.CompletedProcess[str]:
        return pyxis_site_cluster.srun(
            "-N1", export, f"--container-image={ref.replace('/', '#', 1)}", "id", "-u",
            user=slurm_job_user, cwd=Path("/tmp"), timeout=600)

    refused = srun(world.ref("unsigned:1"))
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert (f"{world.ref('unsigned:1')} is rejected by the policy {site_trust / 'policy.json'}"
            in refused.stderr), refused.stderr + _logs(pyxis_site_cluster)
    assert "is ignored: the site makes its image policy mandatory" in refused.stderr
    assert not list((home / "cache" / "pyxis").glob("*.sqsh"))
    admitted = srun(world.ref("signed:1"))
    assert admitted.returncode == 0, (admitted.stdout + admitted.stderr
                                      + _logs(pyxis_site_cluster))
    assert admitted.stdout.split() == [str(slurm_job_user.uid)]
