"""The generated scrun.lua, run by a real Lua 5.3 (+ lua-cjson) with a stub ``slurm`` table,
stages a Docker-style bundle; the staged bundle then runs under a real Slurm's
``srun --container`` inside the job it was staged for, and stage-out removes it.

Debian's Slurm 22.05 has no scrun, so tests/runtimes/scrun_harness.lua plays scrun's part: it
implements the Lua API the hooks use (set_bundle_path, set_root_path, allocator_command,
remote_command, log_*) and calls the hooks with scrun's arguments.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ocistage.cache.leases import all_leases
from ocistage.runtimes.scrun_lua import ScrunLuaOptions, render_scrun_lua
from pytest_ocistage.components import require_binary
from pytest_ocistage.images import OS_RELEASE_NAME, ImageRef
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner, ocistage_command
from tests.runtimes.scrun_bundle import make_engine_bundle

pytestmark = pytest.mark.timeout(600)
HARNESS = Path(__file__).resolve().parents[1] / "runtimes" / "scrun_harness.lua"


@pytest.fixture
def allocation(slurm_22_05: SlurmCluster) -> Iterator[str]:
    """A job allocation, as scrun makes one before it calls stage-in."""
    result = slurm_22_05.salloc("--no-shell", "--job-name=scrun-test", timeout=120)
    match = re.search(r"Granted job allocation (\d+)", result.stderr + result.stdout)
    assert match is not None, result.stderr
    job_id = match.group(1)
    yield job_id
    slurm_22_05.run("scancel", job_id, timeout=60)


def _hook(slurm: SlurmCluster, script: Path, *args: str) -> dict[str, Any]:
    lua = require_binary("lua5.3")
    result = slurm.run(lua, str(HARNESS), str(script), *args, timeout=300)
    if "module 'cjson' not found" in result.stderr:
        require_binary("lua-cjson-module")  # skip, or fail under OCISTAGE_REQUIRE_E2E=1
    assert result.returncode == 0, result.stderr
    state: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return state


def test_scrun_lua_stage_in_srun_container_stage_out(
        ocistage: OcistageRunner, images: dict[str, ImageRef], shared_dir: Path,
        slurm_22_05: SlurmCluster, allocation: str) -> None:
    base = shared_dir / "image-bundle"
    ocistage("bundle", images["busybox"].ref, str(base), check=True)
    engine = shared_dir / "engine"
    bundle, _ = make_engine_bundle(engine, base / "rootfs",
                                   json.loads((base / "config.json").read_text()))
    spool = shared_dir / "spool"
    spool.mkdir(mode=0o700)
    cache = shared_dir / "cache"
    stage_dir = shared_dir / "stage"
    script = shared_dir / "scrun.lua"
    script.write_text(render_scrun_lua(ScrunLuaOptions(
        ocistage=tuple(ocistage_command()), stage_to="shared", stage_dir=str(stage_dir),
        cache=str(cache))))
    uid, gid = str(os.getuid()), str(os.getgid())
    env = json.dumps([f"SLURM_JOB_ID={allocation}", "FROM_JOB=yes", "PATH=/job/bin"])
    stage_in_args = ("stage-in", "c0ffee", str(bundle), str(spool),
                     str(bundle / "config.json"), allocation, uid, gid, env)

    first = _hook(slurm_22_05, script, *stage_in_args)
    assert first["rc"] == 0, first["logs"]
    staged = Path(first["bundle_path"])
    root_path = Path(first["root_path"])
    assert staged == stage_dir / uid / "c0ffee"
    config = json.loads((staged / "config.json").read_text())
    assert config["root"]["path"] == str(root_path)
    assert "cgroupsPath" not in config["linux"] and "prestart" not in config["hooks"]

    # the same rootfs again: nothing is copied (scrun re-creating the same container)
    second = _hook(slurm_22_05, script, *stage_in_args)
    assert second["rc"] == 0
    assert _stage_in_json(first)["copied"] == _stage_in_json(first)["files"] > 0
    report = _stage_in_json(second)
    assert report["copied"] == 0 and report["bytes_copied"] == 0
    assert report["unchanged"] == report["files"] > 0

    leases = [lease for lease in all_leases(cache) if lease.target == f"staged:{root_path}"]
    assert [lease.holder.job_id for lease in leases] == [allocation]

    probe = ('echo "uid=$(id -u)"; echo "cwd=$(pwd)"; grep ^NAME= /etc/os-release; '
             'echo "from_job=$FROM_JOB"; echo "path=$PATH"; '
             'test -e /etc/resolv.conf && echo resolv=yes || echo resolv=no')
    run = slurm_22_05.srun(f"--jobid={allocation}", f"--container={staged}", "sh", "-c", probe,
                           timeout=180)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "uid=1000" in lines
    assert "cwd=/home/app" in lines
    assert f'NAME="{OS_RELEASE_NAME}"' in lines
    assert "from_job=yes" in lines

    out = _hook(slurm_22_05, script, "stage-out", "c0ffee", str(staged), str(bundle),
                str(root_path), str(engine / "storage"), str(spool),
                str(bundle / "config.json"), allocation, uid, gid)
    assert out["rc"] == 0, out["logs"]
    assert not staged.exists() and not root_path.exists()
    assert [lease for lease in all_leases(cache) if lease.target == f"staged:{root_path}"] == []
    assert (bundle / "config.json").exists()  # the engine's own bundle is left alone


def _stage_in_json(state: dict[str, Any]) -> dict[str, Any]:
    """The JSON line that `ocistage scrun stage-in` printed, as the hook read it back."""
    [call] = state["calls"]
    assert call["kind"] == "allocator" and call["rc"] == 0
    lines = [line for line in call["output"].splitlines() if line.startswith("{")]
    result: dict[str, Any] = json.loads(lines[-1])
    return result
