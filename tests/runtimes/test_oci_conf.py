"""oci.conf templates and the linter, per runtime, mode and Slurm version."""

from __future__ import annotations

from pathlib import Path

import pytest

from ocistage.errors import UsageError
from ocistage.runtimes.oci_conf import (
    RUNTIMES,
    OciConfOptions,
    default_root,
    known_keys,
    known_tokens,
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


def test_runc_run_template_matches_slurms_documented_shape() -> None:
    entries, _ = parse_oci_conf(render_oci_conf(OciConfOptions(runtime="runc", version=V22)))
    root = "%b"  # the step's spool directory on 22.05 (runtimes/runtime_state.py)
    assert entries["RunTimeRun"][1] == (
        f"runc --rootless=true --root={root} run %n.%u.%j.%s.%t -b %b")
    assert entries["RunTimeQuery"][1].startswith(
        f"runc --rootless=true --root={root} state %n.%u.%j.%s.%t 2>/dev/null || printf ")
    assert entries["RunTimeKill"][1].endswith("kill -a %n.%u.%j.%s.%t")
    assert entries["RunTimeDelete"][1].endswith("delete --force %n.%u.%j.%s.%t")


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


#: per release, from SchedMD's tags: keys from oci_config.c's options[] (read_oci_conf.c in
#: 22.05), tokens from the cases of slurmstepd's _generate_pattern()
KEYS_22_05 = {"ContainerPath", "CreateEnvFile", "RunTimeCreate", "RunTimeDelete", "RunTimeKill",
              "RunTimeQuery", "RunTimeRun", "RunTimeStart"}
KEYS_23_02 = KEYS_22_05 | {"DebugFlags", "DisableCleanup", "DisableHooks", "EnvExclude",
                           "FileDebug", "IgnoreFileConfigJson", "MountSpoolDir",
                           "RunTimeEnvExclude", "SrunArgs", "SrunPath", "StdIODebug",
                           "SyslogDebug"}
RELEASES = [  # (release, keys, tokens)
    ("22.05", KEYS_22_05, "%@bejnrstu"),
    ("23.02", KEYS_23_02, "%@bejmnprstuU"),
    ("23.11", KEYS_23_02, "%@bejmnprstuU"),
    ("24.05", KEYS_23_02, "%@bejmnprstuU"),
    ("24.11", KEYS_23_02, "%@bejmnprstuU"),
    ("25.05", KEYS_23_02, "%@bejmnprstuU"),
    ("25.11", KEYS_23_02, "%@bejmnprstuU"),
    ("26.05", KEYS_23_02, "%@bejmnprstuUZ"),
]
RUN_BASE = 'RunTimeQuery="q"\nRunTimeKill="k"\nRunTimeDelete="d"\n'


@pytest.mark.parametrize(("release", "keys", "tokens"), RELEASES)
def test_keys_and_tokens_per_release(release: str, keys: set[str], tokens: str) -> None:
    version = SlurmVersion.parse(release)
    assert known_keys(version) == keys
    assert known_tokens(version) == set(tokens)
    # every token the release knows passes the linter, every other letter is fatal
    for char in "%@bejmnprstuUZxqA":
        text = ('RunTimeQuery="q"\nRunTimeDelete="d"\nCreateEnvFile=true\n'
                f'RunTimeKill="x %{char} y"\nRunTimeRun="r"\n')
        problems = [str(p) for p in lint_oci_conf(text, version)]
        if char in tokens:
            assert problems == [], (release, char)
        else:
            assert problems == [f"line 4: RunTimeKill: unknown pattern token %{char} for "
                                f"Slurm {release} (fatal to slurmstepd)"], (release, char)


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
