"""Where the runtime keeps its state under slurmstepd (runtimes/runtime_state.py, issue 34
item 6): never /run/user/UID (no login session on a node), never a directory a co-tenant
can make first; the step's spool directory by default, checked for the caller by doctor."""

from __future__ import annotations

from pathlib import Path

import pytest

from ocistage.bundler.doctor.report import Status
from ocistage.bundler.doctor.runtimestate import check_runtime_state
from ocistage.runtimes.oci_conf import (
    RUNTIMES,
    OciConfOptions,
    lint_oci_conf,
    parse_oci_conf,
    render_oci_conf,
)
from ocistage.runtimes.runtime_state import (
    judge_root,
    made_first_by_others,
    root_problems,
    runtime_root,
)
from ocistage.runtimes.slurm import SlurmVersion

V22, V24, V26 = SlurmVersion(22, 5), SlurmVersion(24, 5), SlurmVersion(26, 5)


def _conf(root: str, extra: str = "") -> dict[str, tuple[int, str]]:
    text = (f'RunTimeQuery="runc --root={root} state ID"\n'
            f'RunTimeRun="runc --rootless=true --root {root} run ID -b %b"\n' + extra)
    return parse_oci_conf(text)[0]


@pytest.mark.parametrize("version", [V22, V24, V26])
@pytest.mark.parametrize("runtime", ["runc", "crun", "nvidia-container-runtime"])
def test_generated_state_is_the_steps_spool_directory(runtime: str,
                                                      version: SlurmVersion) -> None:
    text = render_oci_conf(OciConfOptions(runtime=runtime, version=version))
    entries, _ = parse_oci_conf(text)
    found = runtime_root(entries)
    assert found is not None
    assert found[1] == ("%b" if version == V22 else "%m")
    assert lint_oci_conf(text, version) == []
    assert "/run/user" not in text


@pytest.mark.parametrize("runtime", [r for r in RUNTIMES if r in ("apptainer", "enroot")])
def test_runtimes_without_root_are_not_judged(runtime: str) -> None:
    entries, _ = parse_oci_conf(render_oci_conf(OciConfOptions(runtime=runtime, version=V24)))
    assert runtime_root(entries) is None


@pytest.mark.parametrize("root", ["/run/user/%U/ocistage-runc", "/run/user/$(id -u)/x"])
def test_check_flags_a_root_that_needs_a_login_session(root: str) -> None:
    [(line, message)] = root_problems(_conf(root))
    assert line == 2 and "login session" in message and "%m" in message


@pytest.mark.parametrize("root", ["/tmp/", "/tmp/runc-%u", "/dev/shm/%U/runc",
                                  "/var/tmp/$(id -u)"])
def test_check_flags_a_per_user_name_in_a_world_writable_directory(root: str) -> None:
    [(_, message)] = root_problems(_conf(root))
    assert "co-tenant can make it first" in message


@pytest.mark.parametrize("root", ["%m", "%b", "/var/lib/runc-state/%u", "/tmp/site-runc/%u"])
def test_check_accepts_the_spool_directory_and_site_directories(root: str) -> None:
    assert root_problems(_conf(root)) == []


def test_check_flags_a_container_path_a_co_tenant_can_make_first() -> None:
    [(line, message)] = root_problems(_conf("%m", 'ContainerPath="/tmp/oci-%u"\n'))
    assert line == 3 and "ContainerPath" in message
    assert root_problems(_conf("%m", 'ContainerPath="/var/spool/slurmd/oci"\n')) == []


def test_caller_without_session_is_told_why_run_user_fails() -> None:
    finding = judge_root("/run/user/%U/runc", 1004, 1004, others_in_group=[],
                         container_path=None, run_user=None)
    assert finding.fix is not None and "you have none here" in finding.detail


def test_spool_directory_is_fine_for_a_private_group_only() -> None:
    alone = judge_root("%m", 1004, 1004, others_in_group=[], container_path=None,
                       run_user=None)
    assert alone.fix is None
    shared = judge_root("%m", 1004, 100, others_in_group=["bob"], container_path=None,
                        run_user=None)
    assert shared.fix is not None and "bob" in shared.detail
    in_tmp = judge_root("%m", 1004, 1004, others_in_group=[], container_path="/tmp/%u/oci",
                        run_user=None)
    assert in_tmp.fix is not None and "ContainerPath" in in_tmp.detail


def test_a_directory_others_can_write_is_found_on_the_host(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o1777)
    assert made_first_by_others(f"{open_dir}/runc-%u") == open_dir
    assert made_first_by_others(f"{open_dir}/a/b") == open_dir
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o755)
    assert made_first_by_others(f"{closed}/runc-%u") is None
    finding = judge_root(f"{open_dir}/runc-%u", 1004, 1004, others_in_group=[],
                         container_path=None, run_user=None)
    assert finding.fix is not None


def test_doctor_check_reads_the_nodes_oci_conf(tmp_path: Path) -> None:
    conf = tmp_path / "oci.conf"
    conf.write_text(render_oci_conf(OciConfOptions(runtime="runc", version=V24)))
    check = check_runtime_state(conf, 0)
    assert check is not None and check.status is Status.OK, check
    conf.write_text('RunTimeRun="runc --root=/run/user/%U/r run ID -b %b"\n')
    check = check_runtime_state(conf, 0)
    assert check is not None and check.status is Status.WARN and check.fix
    assert check_runtime_state(tmp_path / "missing", 0) is None
