"""oci.conf templates and the linter, per runtime, mode and Slurm version."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from ocistage.errors import UsageError
from ocistage.runtimes.oci_conf import (
    RUNTIMES,
    OciConfOptions,
    default_root,
    lint_oci_conf,
    lint_oci_conf_file,
    oci_conf_options,
    parse_oci_conf,
    render_oci_conf,
)
from ocistage.runtimes.slurm import SlurmVersion, parse_scontrol_record

V22 = SlurmVersion(22, 5)
V23 = SlurmVersion(23, 2)
V24 = SlurmVersion(24, 5)


@pytest.mark.parametrize("version", [V22, V23, V24])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_template_is_lint_clean_for_its_version(runtime: str,
                                                      version: SlurmVersion) -> None:
    text = render_oci_conf(OciConfOptions(runtime=runtime, version=version))
    assert lint_oci_conf(text, version) == []
    entries, problems = parse_oci_conf(text)
    assert problems == []
    assert "RunTimeRun" in entries
    assert "RunTimeCreate" not in entries and "RunTimeStart" not in entries


@pytest.mark.parametrize("runtime", [*RUNTIMES, "nvidia"])
def test_create_mode_is_refused_with_the_reason(runtime: str) -> None:
    with pytest.raises(UsageError) as refused:
        oci_conf_options(runtime, "create", None, V24)
    assert "hangs" in refused.value.message and "RunTimeStart's status" in refused.value.message
    assert refused.value.hint is not None and "run mode" in refused.value.hint
    with pytest.raises(UsageError, match="unknown mode"):
        oci_conf_options(runtime, "start", None, V24)


def test_options_resolve_the_nvidia_alias_and_refuse_unknown_runtimes() -> None:
    assert oci_conf_options("nvidia", "run", None, V24).runtime == "nvidia-container-runtime"
    with pytest.raises(UsageError, match="unknown runtime 'docker'"):
        oci_conf_options("docker", "run", None, V24)


@pytest.mark.parametrize("version", [V22, V24])
def test_lint_flags_schedmds_create_start_example(version: SlurmVersion) -> None:
    # the runc create/start example of Slurm's containers guide (reference/ in the shared docs)
    text = "\n".join([
        'RunTimeQuery="runc --rootless=true --root=/tmp/ state %n.%u.%j.%s.%t"',
        'RunTimeCreate="runc --rootless=true --root=/tmp/ create %n.%u.%j.%s.%t -b %b"',
        'RunTimeStart="runc --rootless=true --root=/tmp/ start %n.%u.%j.%s.%t"',
        'RunTimeKill="runc --rootless=true --root=/tmp/ kill -a %n.%u.%j.%s.%t"',
        'RunTimeDelete="runc --rootless=true --root=/tmp/ delete --force %n.%u.%j.%s.%t"',
    ])
    problems = lint_oci_conf(text, version)
    assert [(p.line, "create/start mode" in p.message) for p in problems
            if "runtime state" not in p.message] == [(2, True)]


def test_lint_file_reads_a_file_and_refuses_what_is_not_an_oci_conf(tmp_path: Path) -> None:
    good = tmp_path / "oci.conf"
    good.write_text(render_oci_conf(OciConfOptions(runtime="runc", version=V24)))
    assert lint_oci_conf_file(good, V24) == []
    with pytest.raises(UsageError, match="cannot read"):
        lint_oci_conf_file(tmp_path / "missing.conf", V24)
    big = tmp_path / "big.conf"
    with open(big, "wb") as handle:
        handle.truncate(2 * 1024 * 1024)
    with pytest.raises(UsageError, match="larger than"):
        lint_oci_conf_file(big, V24)


#: what slurmstepd puts for each token (Slurm's oci.conf(5)): node, user, uid, job, step,
#: task, the bundle and its rootfs, the step's spool directory; "%%" is a "%"
NODE, USER, JOB, STEP, TASK, BUNDLE = "node7", "alice", "4242", "3", "5", "/srv/staged/b"
SPOOL = "/var/spool/slurmd/oci-job4242-3/task-5"


def expand_like_slurmstepd(value: str) -> str:
    """An oci.conf value as slurmstepd runs it: Slurm's parser drops the backslash of each
    escape (parse_config.c), then each %X token is replaced (the % of an unknown X is fatal
    to slurmstepd, so the linter's job; here it fails the test)."""
    value = re.sub(r"\\(.)", r"\1", value)
    tokens = {"%": "%", "n": NODE, "u": USER, "U": str(os.getuid()), "j": JOB, "s": STEP,
              "t": TASK, "b": BUNDLE, "r": f"{BUNDLE}/rootfs", "m": SPOOL, "@": "/bin/true"}
    return re.sub(r"%(.)", lambda m: tokens[m.group(1)], value)


#: a runtime for the test: records its argv (a line, each argument ended by \\x1f) and, for
#: "state", answers as a runtime does for a running container, or fails as one does for a
#: container that is gone; "run" ends with the container's status, $FAKE_STATUS
FAKE_RUNTIME = """#!/bin/sh
{ for arg in "$@"; do printf '%s\037' "$arg"; done; echo; } >> "$FAKE_LOG"
for arg in "$@"; do
    if [ "$arg" = state ]; then
        [ "$FAKE_GONE" = 1 ] && { echo 'container does not exist' >&2; exit 1; }
        echo '{"ociVersion":"1.0.2","id":"x","status":"running","pid":1}'; exit 0
    fi
done
exit "${FAKE_STATUS:-0}"
"""


def run_line(value: str, runtime: str, tmp_path: Path,
             **env: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """Run one oci.conf value as slurmstepd does (``/bin/sh -c``, as the job user) with the
    fake runtime first on PATH; its result and the argv each runtime call got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / runtime).write_text(FAKE_RUNTIME)
    (bin_dir / runtime).chmod(0o755)
    log = tmp_path / f"calls-{len(list(tmp_path.glob('calls-*')))}.log"
    result = subprocess.run(
        ["/bin/sh", "-c", expand_like_slurmstepd(value)], capture_output=True, text=True,
        timeout=30, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(log), **env})
    lines = log.read_text().splitlines() if log.exists() else []
    calls = [line.split("\x1f")[:-1] for line in lines]
    return result, calls


def option(argv: list[str], *names: str) -> str | None:
    """The value of ``--name=V``, ``--name V`` or ``-n V`` in ``argv``."""
    for n, arg in enumerate(argv):
        for name in names:
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
            if arg == name and n + 1 < len(argv):
                return argv[n + 1]
    return None


@pytest.mark.parametrize("version", [V22, V24, SlurmVersion(26, 5)], ids=str)
@pytest.mark.parametrize("runtime", ["runc", "crun", "nvidia-container-runtime"])
def test_each_runtime_line_does_what_slurmstepd_needs(runtime: str, version: SlurmVersion,
                                                      tmp_path: Path) -> None:
    """Each RunTime* line, expanded and run as slurmstepd runs it, against a runtime with
    runc's command line (Slurm's containers guide: run mode, then query, kill and delete of
    one container id per task)."""
    entries, problems = parse_oci_conf(render_oci_conf(OciConfOptions(runtime=runtime,
                                                                       version=version)))
    assert problems == []
    calls = {}
    for key in ("RunTimeRun", "RunTimeQuery", "RunTimeKill", "RunTimeDelete"):
        result, argvs = run_line(entries[key][1], runtime, tmp_path, FAKE_STATUS="7")
        [calls[key]] = argvs  # each line calls the runtime exactly once
        if key == "RunTimeRun":  # the task's status is the container's
            assert result.returncode == 7, result.stderr
    ids = set()
    for key, argv in calls.items():
        # rootless, with a state directory slurmstepd makes for the job user's step (not
        # /tmp or /run/user: a co-tenant could make the one, a node never logged in to lacks
        # the other): its spool directory, or on 22.05, which has no %m, the bundle's
        assert "--rootless=true" in argv or option(argv, "--rootless") == "true", (key, argv)
        root = option(argv, "--root")
        assert root == (BUNDLE if version == V22 else SPOOL), (key, argv)
        # the container id: the argument after the subcommand's options, the same in every
        # line, and naming node, user, job, step and task, so two tasks never share one
        ids.add(next(arg for arg in argv if NODE in arg))
    [container_id] = ids
    assert {NODE, USER, JOB, STEP, TASK} <= set(re.split(r"[.:_-]", container_id))
    run, kill, delete, query = (calls[k] for k in ("RunTimeRun", "RunTimeKill",
                                                   "RunTimeDelete", "RunTimeQuery"))
    assert "run" in run and option(run, "-b", "--bundle") == BUNDLE
    assert "create" not in run and "start" not in run
    assert "kill" in kill and ("-a" in kill or "--all" in kill)  # every process of it
    assert "delete" in delete and ("--force" in delete or "-f" in delete)
    assert "state" in query


@pytest.mark.parametrize("runtime", ["runc", "crun", "nvidia-container-runtime", "apptainer"])
def test_the_query_answers_json_even_for_a_container_that_is_gone(runtime: str,
                                                                  tmp_path: Path) -> None:
    """slurmstepd parses RunTimeQuery's output as the runtime's JSON state, also after the
    container exited: a running container's state passes through, a gone one is "stopped"
    (and the line succeeds)."""
    entries, _ = parse_oci_conf(render_oci_conf(OciConfOptions(runtime=runtime, version=V24)))
    running, _ = run_line(entries["RunTimeQuery"][1], runtime, tmp_path)
    assert running.returncode == 0 and json.loads(running.stdout)["status"] == "running"
    gone, calls = run_line(entries["RunTimeQuery"][1], runtime, tmp_path, FAKE_GONE="1")
    assert calls and gone.returncode == 0, gone.stderr
    assert json.loads(gone.stdout) == {"status": "stopped"}


def test_state_directory_is_the_steps_spool_directory_the_version_names() -> None:
    assert default_root("runc", V22) == "%b"  # %m is fatal there
    assert default_root("crun", V23) == "%m"
    text = render_oci_conf(OciConfOptions(runtime="crun", version=V24))
    assert "--root=%m " in text
    assert "run --bundle %b %n.%u.%j.%s.%t" in text


def test_srun_path_is_written_where_slurm_knows_it() -> None:
    text = render_oci_conf(OciConfOptions(runtime="runc", version=V24,
                                          srun_path="/opt/slurm/bin/srun"))
    assert 'SrunPath="/opt/slurm/bin/srun"' in text.splitlines()
    assert lint_oci_conf(text, V24) == []
    older = render_oci_conf(OciConfOptions(runtime="runc", version=V22,
                                           srun_path="/opt/slurm/bin/srun"))
    assert "SrunPath" not in older
    with pytest.raises(UsageError, match="srun path"):
        render_oci_conf(OciConfOptions(runtime="runc", version=V24, srun_path="/a b/srun"))


def test_custom_root_is_used_and_shell_syntax_refused() -> None:
    text = render_oci_conf(OciConfOptions(runtime="runc", root="/var/run/runc-%u",
                                          version=V22))
    assert "--root=/var/run/runc-%u " in text
    for bad in ("/a b", "/x;rm -rf /", '/q"', "/$(evil)"):
        with pytest.raises(UsageError):
            render_oci_conf(OciConfOptions(runtime="runc", root=bad, version=V22))


def test_unknown_runtime_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown runtime"):
        render_oci_conf(OciConfOptions(runtime="docker"))


def test_lint_reports_unknown_keys_and_tokens_per_version() -> None:
    text = render_oci_conf(OciConfOptions(runtime="runc", version=V24))
    problems = [str(p) for p in lint_oci_conf(text, V22)]
    assert any("unknown pattern token %m for Slurm 22.05" in p for p in problems)
    assert any("unknown key RunTimeEnvExclude for Slurm 22.05 (added in Slurm 23.02)" in p
               for p in problems)
    assert lint_oci_conf(text, V24) == []
    bad = 'RunTimeQuery="x %q"\nRunTimeKill="k"\nRunTimeDelete="d"\nRunTimeRun="r %b"\nFoo=1\n'
    problems = [str(p) for p in lint_oci_conf(bad, V24)]
    assert problems == ["line 1: RunTimeQuery: unknown pattern token %q for Slurm 24.05 "
                        "(fatal to slurmstepd)", "line 5: unknown key Foo for Slurm 24.05"]


RELEASES = ["22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11", "26.05"]
RUN_BASE = 'RunTimeQuery="q"\nRunTimeKill="k"\nRunTimeDelete="d"\n'
#: the run-mode examples of Slurm's containers guide (22.05; reference/ in the shared docs)
GUIDE_RUN_MODE = {
    "runc": ('RunTimeQuery="runc --rootless=true --root=/tmp/ state %n.%u.%j.%s.%t"\n'
             'RunTimeKill="runc --rootless=true --root=/tmp/ kill -a %n.%u.%j.%s.%t"\n'
             'RunTimeDelete="runc --rootless=true --root=/tmp/ delete --force %n.%u.%j.%s.%t"\n'
             'RunTimeRun="runc --rootless=true --root=/tmp/ run %n.%u.%j.%s.%t -b %b"\n'),
    "crun": ('RunTimeQuery="crun --rootless=true --root=/tmp/ state %n.%u.%j.%s.%t"\n'
             'RunTimeKill="crun --rootless=true --root=/tmp/ kill -a %n.%u.%j.%s.%t"\n'
             'RunTimeDelete="crun --rootless=true --root=/tmp/ delete --force %n.%u.%j.%s.%t"\n'
             'RunTimeRun="crun --rootless=true --root=/tmp/ run --bundle %b %n.%u.%j.%s.%t"\n'),
}


def kill_with(token: str) -> str:
    return ('RunTimeQuery="q"\nRunTimeDelete="d"\nCreateEnvFile=true\n'
            f'RunTimeKill="x %{token} y"\nRunTimeRun="r"\n')


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("runtime", sorted(GUIDE_RUN_MODE))
def test_the_guides_run_mode_examples_pass_on_every_release(runtime: str, release: str) -> None:
    """Every key and token of the guide's examples is known to every release; their one
    problem is the guide's ``--root=/tmp/``, a runtime state directory any user can make
    first (runtimes/runtime_state.py), flagged once, on the line that runs the container."""
    problems = lint_oci_conf(GUIDE_RUN_MODE[runtime], SlurmVersion.parse(release))
    assert len(problems) == 1 and "runtime state in /tmp/" in problems[0].message, problems
    assert "RunTimeRun" in GUIDE_RUN_MODE[runtime].splitlines()[problems[0].line - 1]


@pytest.mark.parametrize("release", RELEASES)
def test_what_came_after_22_05_is_fatal_there_only(release: str) -> None:
    """Slurm 23.02 added the %U (uid) and %m (spool dir) tokens and the keys scrun and
    ocistage's templates use (SrunPath, SrunArgs, RunTimeEnvExclude, ...); 26.05 added %Z."""
    version = SlurmVersion.parse(release)
    old = version < SlurmVersion(23, 2)
    for token in "Um":
        assert (lint_oci_conf(kill_with(token), version) != []) == old, (release, token)
    for key in ("SrunPath=/usr/bin/srun", "SrunArgs=--overlap", 'RunTimeEnvExclude="^X="',
                "DisableHooks=nvidia", "MountSpoolDir=/run/slurm-spool"):
        problems = [str(p) for p in lint_oci_conf(RUN_BASE + 'RunTimeRun="r"\n' + key, version)]
        assert bool(problems) == old, (release, key, problems)
        if old:
            assert problems == [f"line 5: unknown key {key.split('=')[0]} for Slurm 22.05 "
                                "(added in Slurm 23.02)"]
    z = lint_oci_conf(kill_with("Z"), version)
    assert (z == []) == (version >= SlurmVersion(26, 5)), release


@pytest.mark.parametrize("release", RELEASES)
def test_the_documented_tokens_pass_and_any_other_letter_is_fatal(release: str) -> None:
    version = SlurmVersion.parse(release)
    for token in "%@bejnrstu":  # oci.conf(5) of every release since 22.05
        assert lint_oci_conf(kill_with(token), version) == [], (release, token)
    for token in "xqAz":
        assert [str(p) for p in lint_oci_conf(kill_with(token), version)] == [
            f"line 4: RunTimeKill: unknown pattern token %{token} for Slurm {release} "
            "(fatal to slurmstepd)"], (release, token)


def test_z_token_is_fatal_before_26_05() -> None:
    text = RUN_BASE + 'RunTimeRun="runc run %Z -b %b"\n'
    assert [str(p) for p in lint_oci_conf(text, V24)] == [
        "line 4: RunTimeRun: unknown pattern token %Z for Slurm 24.05 (fatal to slurmstepd)"]
    assert [str(p) for p in lint_oci_conf(text, SlurmVersion(25, 11))] != []
    assert lint_oci_conf(text, SlurmVersion(26, 5)) == []


def test_srun_args_may_repeat_other_keys_may_not() -> None:
    text = (RUN_BASE + 'RunTimeRun="r"\nSrunPath=/usr/bin/srun\nSrunArgs=--mpi=none\n'
            "SrunArgs=--overlap\n")
    entries, problems = parse_oci_conf(text)
    assert problems == []
    assert entries["SrunArgs"] == (7, "--overlap")
    assert lint_oci_conf(text, V24) == []
    assert [str(p) for p in lint_oci_conf(text, V22)] == [
        "line 5: unknown key SrunPath for Slurm 22.05 (added in Slurm 23.02)",
        "line 7: unknown key SrunArgs for Slurm 22.05 (added in Slurm 23.02)"]
    assert [str(p) for p in lint_oci_conf(text + "SrunPath=/bin/srun\n", V24)] == [
        "line 8: SrunPath is set again (first on line 5)"]


def test_lint_required_and_dependent_keys() -> None:
    assert [str(p) for p in lint_oci_conf("", V22)] == [
        "missing RunTimeRun",
        "missing required key RunTimeDelete",
        "missing required key RunTimeKill",
        "missing required key RunTimeQuery",
    ]
    base = 'RunTimeQuery="q"\nRunTimeKill="k"\nRunTimeDelete="d"\n'
    assert [str(p).split(":")[:2] for p in lint_oci_conf(base + 'RunTimeCreate="c %b"\n',
                                                         V22)] == [
        ["line 4", " RunTimeCreate needs RunTimeStart"],
        ["line 4", " create/start mode does not work with slurmstepd"]]
    both = base + 'RunTimeRun="r"\nRunTimeStart="s"\n'
    assert [str(p) for p in lint_oci_conf(both, V22)] == [
        "line 4: RunTimeRun excludes RunTimeCreate/RunTimeStart"]
    env = base + 'RunTimeRun="r --env-file %e"\n'
    assert [str(p) for p in lint_oci_conf(env, V22)] == [
        "line 4: RunTimeRun uses %e but CreateEnvFile is not enabled"]
    assert lint_oci_conf(env + "CreateEnvFile=true\n", V22) == []
    assert [str(p) for p in lint_oci_conf(env + "CreateEnvFile=newline\n", V22)] == [
        "line 5: CreateEnvFile must be one of false|true for Slurm 22.05"]
    assert lint_oci_conf(env + "CreateEnvFile=newline\n", V23) == []


def test_lint_pid_token_only_where_a_container_exists() -> None:
    text = ('RunTimeQuery="q %p"\nRunTimeKill="kill %p"\nRunTimeDelete="d %p"\n'
            'RunTimeRun="r"\n')
    assert [str(p) for p in lint_oci_conf(text, V23)] == [
        "line 1: RunTimeQuery: %p is only known in RunTimeKill and RunTimeDelete"]


def test_parser_case_comments_quotes_duplicates() -> None:
    text = ('# comment\nruntimequery="a \\# escaped" # comment\n'
            'RUNTIMEKILL=k\nRunTimeKill=k2\nnonsense\nRunTimeRun="unterminated\n'
            'RunTimeDelete="quoted # is a comment too, as parse_config.c cuts it"\n')
    entries, problems = parse_oci_conf(text)
    assert entries["RunTimeQuery"] == (2, "a \\# escaped")
    assert entries["RunTimeKill"] == (4, "k2")
    assert [str(p) for p in problems] == [
        "line 4: RunTimeKill is set again (first on line 3)",
        "line 5: not a Key=Value line: 'nonsense'",
        "line 6: RunTimeRun: unterminated quote",
        "line 7: RunTimeDelete: unterminated quote",
    ]


def test_percent_escapes_are_not_tokens() -> None:
    text = ('RunTimeQuery="printf 100%%"\nRunTimeKill="k"\nRunTimeDelete="d"\n'
            'RunTimeRun="r %%%b 5%"\n')
    assert [str(p) for p in lint_oci_conf(text, V22)] == [
        "line 4: RunTimeRun: a lone % at the end of the pattern"]


def test_slurm_version_parse_and_order() -> None:
    assert SlurmVersion.parse("slurm-wlm 22.05.8") == SlurmVersion(22, 5, 8)
    assert str(SlurmVersion.parse("23.11")) == "23.11"
    assert SlurmVersion.parse("22.05.8") < SlurmVersion(23, 2)
    with pytest.raises(UsageError):
        SlurmVersion.parse("latest")


def test_scontrol_record_values_keep_spaces() -> None:
    line = ("JobId=7 JobName=wrap UserId=root(0) JobState=COMPLETED Reason=None "
            "Command=(null) WorkDir=/tmp/a b Container=/srv/staged/x StdOut=/tmp/o.txt\n")
    record = parse_scontrol_record(line)
    assert record["JobId"] == "7"
    assert record["WorkDir"] == "/tmp/a b"
    assert record["Container"] == "/srv/staged/x"
    assert record["UserId"] == "root(0)"
