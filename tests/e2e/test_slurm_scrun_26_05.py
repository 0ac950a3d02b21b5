"""The scrun.lua that `ocistage runtime scrun-lua --slurm-version 26.05` writes, as written
(``slurm.from_json``/``slurm.to_json`` instead of lua-cjson), driven by the real scrun of the
26.05.3 test cluster as in tests/e2e/test_scrun_24_05.py (whose wrappers it reuses)."""

from __future__ import annotations

import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache.leases import all_leases
from pytest_ocistage.components import require_binary
from pytest_ocistage.images import OS_RELEASE_NAME, ImageRef
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner
from tests.e2e.test_scrun_24_05 import Scrun, _engine_bundle, _staged_where

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def scrun_26_05(slurm_26_05: SlurmCluster, ocistage: OcistageRunner) -> Iterator[Scrun]:
    cluster = slurm_26_05
    binary = cluster.bin_dir / "scrun"
    if not binary.exists():
        require_binary("scrun-of-the-26.05-build")
    work = Path(tempfile.mkdtemp(prefix="ocistage-scrun-", dir="/tmp"))
    work.chmod(0o755)
    conf = shlex.quote(str(cluster.slurm_conf))
    wrappers = {**{name: f"exec {shlex.quote(str(cluster.bin_dir / name))} \"$@\""
                   for name in ("srun", "sbatch", "scancel")},
                "scrun": f"exec {shlex.quote(str(binary))} --root "
                         f"{shlex.quote(str(work / 'scrun-root'))} \"$@\""}
    for name, line in wrappers.items():
        (work / name).write_text(f"#!/bin/sh\nSLURM_CONF={conf}; export SLURM_CONF\n{line}\n")
        (work / name).chmod(0o755)
    oci_conf = "".join(line + "\n" for line in cluster.oci_conf.read_text().splitlines()
                       if not line.startswith("SrunPath="))
    oci_conf += f'SrunPath="{work / "srun"}"\n'
    lua = cluster.conf_dir / "scrun.lua"
    try:
        with cluster.use_oci_conf(oci_conf):
            yield Scrun(cluster, work, work / "scrun", work / "cache", ocistage)
    finally:
        lua.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def test_generated_scrun_lua_for_26_05_stages_in_and_out_with_slurms_json(
        scrun_26_05: Scrun, images: dict[str, ImageRef]) -> None:
    scrun = scrun_26_05
    stage_dir = scrun.work / "stage"
    result = scrun.ocistage("runtime", "scrun-lua", "--slurm-version", "26.05", "--stage-to",
                            "shared", "--stage-dir", str(stage_dir), "--ocistage",
                            " ".join(scrun.ocistage.command), "--cache", str(scrun.cache),
                            "--sbatch", str(scrun.work / "sbatch"), check=True)
    assert "slurm.from_json" in result.stdout and "cjson" not in result.stdout
    (scrun.cluster.conf_dir / "scrun.lua").write_text(result.stdout)
    bundle = _engine_bundle(scrun, images["busybox"], "/bin/sh", "-c",
                            "echo uid=$(id -u); grep ^NAME= /etc/os-release; exit 0")
    out = scrun.create(bundle, "run26")
    anchor = scrun.state("run26")["pid"]
    scrun.wait_for_line(out, "uid=1000")
    scrun.wait_stopped("run26", anchor)
    scrun.run("delete", "run26")
    lines = out.read_text().splitlines()
    assert "uid=1000" in lines and f'NAME="{OS_RELEASE_NAME}"' in lines, lines
    # what the hooks did is scrun's -v (log_verbose): nothing of it at the default level,
    # which is the user's terminal under podman/docker run (issue 38)
    assert not any("ocistage staged" in line for line in lines), lines
    assert _staged_where(scrun, "shared", stage_dir, "run26") == []
    assert all_leases(scrun.cache) == []
