"""`ocistage runtime ...`, `ocistage scrun ...` and `ocistage submit` argument handling, run
as the real command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from pytest_ocistage.components import require_binary

CLI = [sys.executable, "-c", "from ocistage.bundler.cli.app import main; main()"]


SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


def ocistage(*args: str, cwd: Path | None = None,
             path: str = SYSTEM_PATH) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=cwd, stdin=subprocess.DEVNULL,
                          env={"PATH": path, "NO_COLOR": "1",
                               "COLUMNS": "200", "HOME": str(cwd or Path.cwd())})


def test_oci_conf_generates_and_checks(tmp_path: Path) -> None:
    result = ocistage("runtime", "oci-conf", "--runtime", "nvidia", "--mode", "run",
                      "--slurm-version", "23.02")
    assert result.returncode == 0, result.stderr
    assert 'RunTimeRun="nvidia-container-runtime --rootless=true --root=%m ' in result.stdout
    srun = shutil.which("srun", path="/usr/bin:/bin:/usr/sbin:/sbin")
    assert (f'SrunPath="{srun}"' in result.stdout.splitlines()) == (srun is not None)
    conf = tmp_path / "oci.conf"
    conf.write_text(result.stdout)
    assert ocistage("runtime", "oci-conf", "--check", str(conf), "--slurm-version",
                    "23.02").returncode == 0
    checked = ocistage("runtime", "oci-conf", "--check", str(conf), "--slurm-version", "22.05")
    assert checked.returncode == 1
    lines = checked.stdout.splitlines()
    # four commands with %m (the runtime root), RunTimeEnvExclude (and SrunPath)
    assert len(lines) == 5 + (srun is not None)
    assert all(line.startswith(f"{conf}: line ") for line in lines)


def test_oci_conf_usage_errors() -> None:
    for args in (("--runtime", "docker"), ("--mode", "exec"), ("--mode", "create"),
                 ("--runtime", "enroot", "--mode", "create"),
                 ("--slurm-version", "x"), ("--root", "/a b")):
        result = ocistage("runtime", "oci-conf", *args, "--slurm-version", "22.05") \
            if "--slurm-version" not in args else ocistage("runtime", "oci-conf", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith("error: ")
    missing = ocistage("runtime", "oci-conf", "--check", "/nonexistent/oci.conf",
                       "--slurm-version", "22.05")
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_scrun_lua_is_valid_lua(tmp_path: Path) -> None:
    luac = require_binary("luac5.3")
    for stage_to in ("shared", "node-local"):
        result = ocistage("runtime", "scrun-lua", "--stage-to", stage_to, "--stage-dir",
                          "/scratch/o'dd \"dir\"", "--ocistage", "/opt/bin/ocistage")
        assert result.returncode == 0, result.stderr
        script = tmp_path / f"{stage_to}.lua"
        script.write_text(result.stdout)
        check = subprocess.run([luac, "-p", str(script)], capture_output=True, text=True,
                               timeout=30, check=False)
        assert check.returncode == 0, check.stderr
    assert ocistage("runtime", "scrun-lua", "--stage-to", "cloud").returncode == 2


def test_scrun_lua_defaults_draw_no_warning_of_its_own() -> None:
    """Issue 38: the node-local default STAGE_DIR was /tmp/ocistage-scrun, which the same
    command then warned about (26.05's namespace/tmpfs makes /tmp private to each job)."""
    for version in ("24.05", "26.05"):
        result = ocistage("runtime", "scrun-lua", "--stage-to", "node-local",
                          "--ocistage", "/opt/bin/ocistage", "--slurm-version", version)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert 'local STAGE_DIR = "/var/tmp/ocistage-scrun"' in result.stdout
    shared = ocistage("runtime", "scrun-lua", "--ocistage", "/opt/bin/ocistage",
                      "--slurm-version", "26.05")
    assert shared.stderr == "" and 'local STAGE_DIR = "/tmp/ocistage-scrun"' in shared.stdout
    asked = ocistage("runtime", "scrun-lua", "--stage-to", "node-local", "--stage-dir",
                     "/tmp/s", "--ocistage", "/opt/bin/ocistage", "--slurm-version", "26.05")
    assert asked.returncode == 0 and asked.stderr.startswith("warning: --stage-dir /tmp/s ")


def test_engine_configs_name_the_scrun_on_path(tmp_path: Path) -> None:
    docker = ocistage("runtime", "docker-config", "--scrun", "/usr/local/sbin/scrun")
    assert docker.returncode == 0
    assert json.loads(docker.stdout)["runtimes"]["slurm"]["path"] == "/usr/local/sbin/scrun"
    assert "--security-opt" in docker.stderr
    # a site's Slurm under its own prefix (Debian's 22.05 has no scrun)
    prefix = tmp_path / "opt" / "slurm" / "bin"
    prefix.mkdir(parents=True)
    (prefix / "scrun").write_text("#!/bin/sh\n")
    (prefix / "scrun").chmod(0o755)
    path = f"{prefix}:{SYSTEM_PATH}"
    podman = ocistage("runtime", "podman-config", path=path)
    assert podman.returncode == 0, podman.stderr
    assert f'slurm = ["{prefix}/scrun"]' in podman.stdout.splitlines()
    docker = ocistage("runtime", "docker-config", path=path)
    assert json.loads(docker.stdout)["runtimes"]["slurm"]["path"] == f"{prefix}/scrun"
    for command in ("podman-config", "docker-config"):
        missing = ocistage("runtime", command, path=SYSTEM_PATH if not shutil.which(
            "scrun", path=SYSTEM_PATH) else str(tmp_path / "empty"))
        assert missing.returncode == 2
        assert "scrun not found on PATH" in missing.stderr


def test_scrun_stage_out_refuses_an_unmarked_directory(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "rootfs").mkdir(parents=True)
    result = ocistage("scrun", "stage-out", "--bundle", str(victim), "--cache",
                      str(tmp_path / "cache"))
    assert result.returncode == 1
    assert "not staged by `ocistage scrun stage-in`" in result.stderr
    assert (victim / "rootfs").is_dir()


def test_submit_refuses_container_and_wrap_options(tmp_path: Path) -> None:
    for option in ("--container=/x", "--wrap=true"):
        result = ocistage("submit", f"oci:{tmp_path / 'no-layout'}:x", "--cache",
                          str(tmp_path / "c"), option, "--", "true", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert "is set by ocistage submit" in result.stderr


def test_submit_finds_its_stage_target_as_stage_does(tmp_path: Path) -> None:
    ref = f"oci:{tmp_path / 'no-layout'}:x"
    for command in (["stage", ref], ["submit", ref]):
        result = ocistage(*command, "--cache", str(tmp_path / "c"), cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: no stage target"), result.stderr
    url = ocistage("submit", ref, "--stage-to", "memory://x", "--cache", str(tmp_path / "c"),
                   cwd=tmp_path)
    assert url.returncode == 2 and "a directory the nodes see, not memory:" in url.stderr
