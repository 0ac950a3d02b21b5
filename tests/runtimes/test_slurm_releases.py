"""What changed between Slurm releases that the generators and the linter know (issue 26):
each rule on the release where it starts and on the one before."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ocistage.runtimes.oci_conf import (
    RUNTIMES,
    OciConfOptions,
    lint_oci_conf,
    lint_slurm_conf,
    parse_oci_conf,
    per_job_dir,
    render_oci_conf,
)
from ocistage.runtimes.scrun_lua import SLURM_JSON, render_scrun_lua, scrun_lua_options
from ocistage.runtimes.slurm import SlurmVersion
from pytest_ocistage.runner import OcistageRunner

V24_05, V25_05 = SlurmVersion(24, 5), SlurmVersion(25, 5)
V25_11, V26_05 = SlurmVersion(25, 11), SlurmVersion(26, 5)
BASE = 'RunTimeQuery="q"\nRunTimeKill="k"\nRunTimeDelete="d"\nRunTimeRun="r %b"\n'


def _as_slurm_reads(value: str) -> str:
    """The value after Slurm's parser dropped its escapes (parse_config.c _strip_escapes)."""
    out, index = [], 0
    while index < len(value):
        if value[index] == "\\":
            index += 1
        if index < len(value):
            out.append(value[index])
        index += 1
    return "".join(out)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("version", [SlurmVersion(22, 5), V24_05, V26_05])
def test_query_of_a_gone_container_prints_stopped_state_json_and_succeeds(
        runtime: str, version: SlurmVersion, tmp_path: Path) -> None:
    """As slurmstepd runs it (/bin/sh -c, after the container was deleted): one JSON object
    with a status on stdout and exit 0, whether the runtime is installed or not."""
    text = render_oci_conf(OciConfOptions(runtime=runtime, version=version,
                                          root=str(tmp_path / "state")))
    assert lint_oci_conf(text, version) == []
    entries, _ = parse_oci_conf(text)
    command = _as_slurm_reads(entries["RunTimeQuery"][1])
    for token, value in (("%n", "node"), ("%u", "user"), ("%j", "1"), ("%s", "0"),
                         ("%t", "0"), ("%U", str(os.getuid()))):
        command = command.replace(token, value)
    assert '"' not in entries["RunTimeQuery"][1]  # a quoted oci.conf value cannot hold one
    result = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                            timeout=60, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"status": "stopped"}


def test_container_path_is_a_task_pattern_before_25_05_and_a_parent_from_it() -> None:
    parent = BASE + 'ContainerPath="/run/slurm-oci"\n'
    per_task = BASE + 'ContainerPath="/run/slurm-oci/%j-%s/task-%t"\n'
    assert [str(p) for p in lint_oci_conf(parent, V24_05)] == [
        "line 5: ContainerPath is each task's spool directory in Slurm 24.05 (before 25.05): "
        "without %j, %s and %t jobs, steps and tasks share it (default "
        "%m/oci-job%j-%s/task-%t/)"]
    assert lint_oci_conf(per_task, V24_05) == []
    assert lint_oci_conf(parent, V25_05) == []
    problems = [str(p) for p in lint_oci_conf(per_task, V25_05)]
    assert len(problems) == 1 and "parent of the per-step directories" in problems[0]


def test_percent_z_is_known_from_26_05() -> None:
    text = BASE.replace('"r %b"', '"r %b %Z"')
    assert lint_oci_conf(text, V26_05) == []
    assert [str(p) for p in lint_oci_conf(text, V25_11)] == [
        "line 4: RunTimeRun: unknown pattern token %Z for Slurm 25.11 (fatal to slurmstepd)"]


def test_job_container_type_became_namespace_type_in_25_11() -> None:
    old = "ClusterName=x\nJobContainerType=job_container/tmpfs  # per-job /tmp\n"
    new = "NamespaceType=namespace/tmpfs\n"
    assert lint_slurm_conf(old, V25_05) == []
    assert [str(p) for p in lint_slurm_conf(old, V25_11)] == [
        "line 2: JobContainerType is gone in Slurm 25.11: use NamespaceType=namespace/tmpfs"]
    assert lint_slurm_conf(new, V25_11) == []
    assert [str(p) for p in lint_slurm_conf(new, V25_05)] == [
        "line 1: NamespaceType is unknown to Slurm 25.05 (added in 25.11): use "
        "JobContainerType=job_container/tmpfs"]


def test_tmp_and_dev_shm_are_per_job_from_25_11() -> None:
    assert per_job_dir("/tmp/ocistage-scrun", V25_05) is None
    assert per_job_dir("/tmp/ocistage-scrun", V25_11) == "/tmp"
    assert per_job_dir("/dev/shm", V25_11) == "/dev/shm"
    assert per_job_dir("/tmpfoo/x", V25_11) is None
    assert per_job_dir("/scratch/local", V26_05) is None


def test_scrun_lua_uses_slurms_json_from_26_05_and_cjson_before() -> None:
    def lua(version: SlurmVersion) -> str:
        return render_scrun_lua(scrun_lua_options(
            ocistage="/opt/bin/ocistage", stage_to="shared", stage_dir="/scratch/s",
            cache=None, sbatch=None, find_sbatch=False, version=version))

    assert 'require("cjson")' in lua(V25_11) and SLURM_JSON not in lua(V25_11)
    assert SLURM_JSON in lua(V26_05) and "cjson" not in lua(V26_05)


def test_cli_warns_of_a_node_local_stage_dir_in_tmp_from_25_11(tmp_path: Path) -> None:
    ocistage = OcistageRunner.in_directory(tmp_path, cache=tmp_path / "cache")
    args = ("runtime", "scrun-lua", "--stage-to", "node-local", "--stage-dir",
            "/tmp/ocistage-scrun", "--ocistage", "/opt/bin/ocistage", "--no-cleanup-job")
    before = ocistage(*args, "--slurm-version", "25.05")
    assert before.returncode == 0 and "warning" not in before.stderr
    after = ocistage(*args, "--slurm-version", "25.11")
    assert after.returncode == 0, after.stderr
    assert "warning: --stage-dir /tmp/ocistage-scrun is in /tmp" in after.stderr
    assert "slurm.from_json" in ocistage(*args, "--slurm-version", "26.05").stdout


def test_cli_check_lints_slurm_conf_too(tmp_path: Path) -> None:
    ocistage = OcistageRunner.in_directory(tmp_path, cache=tmp_path / "cache")
    conf, slurm_conf = tmp_path / "oci.conf", tmp_path / "slurm.conf"
    conf.write_text(render_oci_conf(OciConfOptions(version=V26_05, root="/run/oci")))
    slurm_conf.write_text("JobContainerType=job_container/tmpfs\n")
    good = ocistage("runtime", "oci-conf", "--check", str(conf), "--slurm-version", "25.05",
                    "--slurm-conf", str(slurm_conf))
    assert good.returncode == 0, good.stdout + good.stderr
    bad = ocistage("runtime", "oci-conf", "--check", str(conf), "--slurm-version", "26.05",
                   "--slurm-conf", str(slurm_conf))
    assert bad.returncode == 1
    assert bad.stdout.strip() == (f"{slurm_conf}: line 1: JobContainerType is gone in Slurm "
                                  "26.05: use NamespaceType=namespace/tmpfs")
