"""``ocistage doctor`` run for real on this machine: as root, and as an unprivileged user
(``setpriv``, nobody), against what the host really has (the runtimes' own --version, /dev/fuse,
the cgroup layout) and a real registry."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_ocistage.components import Registry, require_root
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner

NOBODY = 65534


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["name"]: check for check in report["checks"]}


def _version(binary: str) -> tuple[int, ...] | None:
    if shutil.which(binary) is None:
        return None
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"version (\d+)\.(\d+)", out.stdout)
    assert match is not None, out.stdout
    return int(match.group(1)), int(match.group(2))


def _hybrid_controllers() -> str:
    try:
        return Path("/sys/fs/cgroup/unified/cgroup.controllers").read_text().strip()
    except OSError:
        return ""


def test_doctor_as_root(ocistage: OcistageRunner, plain_registry: Registry,
                        tmp_path: Path) -> None:
    require_root()  # the root view of the host
    target = tmp_path / "staged"
    result = ocistage("doctor", "--json", "--to", str(target), "--registry",
                      plain_registry.host)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], result.stdout
    checks = _checks(report)
    assert report["uid"] == 0 and report["user"] == "root"
    for name in ("config", "cache", "stage_target", "registry", "userns", "subuid",
                 "xdg_runtime_dir"):
        assert checks[name]["status"] == "ok", checks[name]
    assert not target.exists()  # nothing is made
    assert not ocistage.cache.exists()
    runc = _version("runc")
    if runc is not None:
        assert checks["runc"]["status"] == "ok"  # root runs any bundle with runc 1.1 too
        assert f"runc {runc[0]}.{runc[1]}" in checks["runc"]["detail"]
    crun = _version("crun")
    if crun is not None:
        assert (checks["crun"]["status"] == "warn") == bool(_hybrid_controllers())
    if shutil.which("mksquashfs"):
        assert "zstd" in checks["mksquashfs"]["detail"]
    human = ocistage("doctor", "--to", str(target))
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert len(lines) == len(report["checks"]) - 1  # the registry was not asked this time
    assert all(re.match(r"(ok|warn|missing) +\S+ +\S", line) for line in lines), lines
    assert all("; fix: " in line for line in lines if not line.startswith("ok"))


def test_doctor_fails_for_an_untrusted_cache_and_a_registry_that_is_down(
        ocistage: OcistageRunner, tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)  # writable by every user, not sticky: the trust rule refuses it
    result = ocistage("doctor", "--json", "--registry", "127.0.0.1:9",
                      env={"OCISTAGE_CACHE": str(cache)})
    assert result.returncode == 1
    checks = _checks(json.loads(result.stdout))
    assert checks["cache"]["status"] == "missing" and checks["cache"]["core"]
    assert "writable by every user" in checks["cache"]["detail"]
    assert checks["registry"]["status"] == "missing"
    human = ocistage("doctor", env={"OCISTAGE_CACHE": str(cache)})
    assert human.returncode == 1
    assert "missing for pull, bundle, stage or cache: cache" in human.stderr


@pytest.fixture
def nobody_home() -> Iterator[Path]:
    """A HOME for nobody outside pytest's private tmp_path (which nobody cannot reach)."""
    base = Path(tempfile.mkdtemp(prefix="ocistage-doctor-"))
    base.chmod(0o755)
    home = base / "home"
    (home / "run").mkdir(parents=True)
    for path in (home, home / "run"):
        os.chown(path, NOBODY, NOBODY)
    (home / "run").chmod(0o700)
    yield home
    shutil.rmtree(base)


def _as_nobody(ocistage: OcistageRunner, home: Path, *args: str,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = ocistage.environment({"HOME": str(home), "OCISTAGE_CACHE":
                                        str(home / "cache"), "XDG_CACHE_HOME":
                                        str(home / ".cache"), "XDG_CONFIG_HOME":
                                        str(home / ".config"), "XDG_RUNTIME_DIR":
                                        str(home / "run"), **(env or {})})
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                           "--clear-groups", *ocistage.command, "doctor", *args],
                          env=environment, cwd=home, capture_output=True, text=True,
                          timeout=120, check=False, stdin=subprocess.DEVNULL)


@pytest.mark.needs_root("needs root and setpriv to act as another user")
def test_doctor_as_a_user(ocistage: OcistageRunner, plain_registry: Registry,
                          nobody_home: Path) -> None:
    result = _as_nobody(ocistage, nobody_home, "--json", "--to", str(nobody_home / "staged"),
                        "--registry", plain_registry.host)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["uid"] == NOBODY and report["ok"]
    checks = _checks(report)
    for name in ("config", "cache", "stage_target", "registry", "xdg_runtime_dir"):
        assert checks[name]["status"] == "ok", checks[name]
    runc = _version("runc")
    if runc is not None and runc < (1, 2):
        assert checks["runc"]["status"] == "warn"
        assert "--map-root" in checks["runc"]["fix"]
    fuse = os.stat("/dev/fuse") if os.path.exists("/dev/fuse") else None
    if fuse is not None and not fuse.st_mode & stat.S_IWOTH:
        assert checks["fuse"]["status"] == "warn"
        assert "not open to you" in checks["fuse"]["detail"]
    subuid = Path("/etc/subuid").read_text() if Path("/etc/subuid").exists() else ""
    if not re.search(r"^(nobody|65534):", subuid, re.MULTILINE):
        assert checks["subuid"]["status"] == "warn"
    # without XDG_RUNTIME_DIR runc needs --root; a cache of another user is refused
    foreign = nobody_home / "foreign"
    foreign.mkdir()
    os.chown(foreign, 4242, 4242)
    worse = _as_nobody(ocistage, nobody_home, "--json",
                       env={"XDG_RUNTIME_DIR": "", "OCISTAGE_CACHE": str(foreign)})
    assert worse.returncode == 1, worse.stderr
    checks = _checks(json.loads(worse.stdout))
    assert checks["xdg_runtime_dir"]["status"] == "warn"
    assert "--root" in checks["xdg_runtime_dir"]["fix"]
    assert checks["cache"]["status"] == "missing"
    assert "owned by uid 4242" in checks["cache"]["detail"]
    assert not (nobody_home / "cache").exists()


def test_doctor_asks_slurm_where_its_configuration_is(ocistage: OcistageRunner,
                                                      slurm_24_05: SlurmCluster) -> None:
    """Issue 38: a Slurm built into a prefix reads PREFIX/etc/slurm.conf without SLURM_CONF;
    doctor checked Debian's /etc/slurm/oci.conf instead (another cluster's, or none). It asks
    the real scontrol (`scontrol show config`, answered by slurmctld: the configuration the
    cluster's daemons read, here the test cluster's own directory) and lints the oci.conf
    beside it."""
    etc = slurm_24_05.bin_dir.parent / "etc"
    if (etc / "slurm.conf").exists() or (etc / "oci.conf").exists():
        pytest.skip(f"{etc} has a Slurm configuration of its own: not replaced by a test")
    made = not etc.exists()
    etc.mkdir(exist_ok=True)
    try:
        shutil.copyfile(slurm_24_05.slurm_conf, etc / "slurm.conf")
        shutil.copyfile(slurm_24_05.oci_conf, etc / "oci.conf")
        result = ocistage("doctor", "--json", env={
            "PATH": f"{slurm_24_05.bin_dir}:{os.environ['PATH']}"})
        checks = _checks(json.loads(result.stdout))
        assert "SLURM_CONF" not in ocistage.environment()
        oci = checks["oci.conf"]
        assert oci["detail"].startswith(f"{slurm_24_05.oci_conf}:"), oci
        assert oci["status"] == "ok", oci
        # and with the controller's configuration nowhere to be found: said, not guessed
        (etc / "slurm.conf").unlink()
        lost = _checks(json.loads(ocistage("doctor", "--json", env={
            "PATH": f"{slurm_24_05.bin_dir}:{os.environ['PATH']}"}).stdout))["oci.conf"]
        assert lost["status"] == "warn" and "/etc/slurm/" not in lost["detail"], lost
        assert "SLURM_CONF" in lost["fix"], lost
    finally:
        for name in ("slurm.conf", "oci.conf"):
            (etc / name).unlink(missing_ok=True)
        if made:
            etc.rmdir()
