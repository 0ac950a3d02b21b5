"""Every place where data becomes a command line or a file with syntax (docs/trust.md, "Data
that becomes syntax"): hostile strings (tests/hostile.py) from image configs, references and
user options go through each builder, and what comes out has the structure a benign value of
the same kind gives, parsed by the real parser where it runs here (sh, luac5.3, lua5.3, groff,
tomllib, json) or by a model of Slurm's (its oci.conf parser and pattern expansion, its getopt
option order) -- or the value is refused with the project's typed error.

The other builders of that list are tested beside their code: mksquashfs pseudo definitions
(bundler/pyxis/mksquashfs.py, stagers/), enroot's files and the completion output.
"""

from __future__ import annotations

import dataclasses
import getopt
import json
import os
import re
import shlex
import subprocess
import tomllib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ocistage.bundler.cli.manpage import section
from ocistage.errors import OcistageError, UsageError
from ocistage.runtimes.engines import conmon_path, docker_daemon_json, podman_containers_conf
from ocistage.runtimes.oci_conf import (
    OciConfOptions,
    known_tokens,
    lint_oci_conf,
    lint_oci_conf_file,
    render_oci_conf,
)
from ocistage.runtimes.scrun_cleanup import cleanup_job_options, stage_out_command
from ocistage.runtimes.scrun_lua import ScrunLuaOptions, lua_string, render_scrun_lua
from ocistage.runtimes.slurm import SlurmVersion, sbatch_argv, srun_argv
from ocistage.runtimes.submit import (
    check_command,
    check_container_path,
    check_options,
    cleanup_options,
    encodable,
    held_job_options,
    unstage_command,
    wrap_command,
)
from ocistage.runtimes.userrun import user_run_command
from pytest_ocistage.components import require_binary
from tests.bundler.clirun import Cli, cli
from tests.hostile import benign, hostile, hostile_bytes, hostile_text

__all__ = ["cli"]  # the fixture

#: modest: every example of the Lua, sh and groff tests starts a process
PROPERTY = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
#: the tests that start no process
PURE = settings(PROPERTY, max_examples=200)
VERSIONS = (SlurmVersion(22, 5), SlurmVersion(24, 5), SlurmVersion(26, 5))


def _refused_cleanly(exc: OcistageError) -> None:
    assert exc.message and "\n" not in exc.message[:200]
    assert exc.hint


def _run(argv: Sequence[str], data: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(argv), input=data, capture_output=True, timeout=60, check=False)


# -- argv: sbatch, srun, the --wrap text ----------------------------------------------------------

#: a model of the getopt_long Slurm's commands use ("+": options end at the first word that is
#: none, or at --): enough of sbatch's and srun's options for the user options drawn here
_SHORT = "p:t:N:A:q:o:Hv"
_LONG = ["parsable", "hold", "container=", "wrap=", "partition=", "time=", "output=",
         "account=", "qos=", "export=", "chdir=", "job-name="]


def _getopt(args: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    return getopt.getopt(list(args), _SHORT, _LONG)


#: the user's sbatch/srun options: an option and, where it takes one, a (hostile) value
_USER_OPTIONS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["-p", "-t", "-A", "--partition", "--output", "--time"]),
              st.one_of(benign("option"), hostile("option", exclude=["nul"]))).map(list),
    st.one_of(benign("option"), hostile("option", exclude=["nul"])).map(
        lambda value: [f"--output={value}"]),
    st.sampled_from([["-H"], ["--hold"], ["-v"], ["-p"]]),  # -p alone: sbatch's error
), max_size=4).map(lambda parts: [word for part in parts for word in part])
_COMMAND = st.lists(st.one_of(benign("word"), hostile("word")), min_size=1, max_size=4)
_PATH = st.one_of(benign("path"), hostile("path"))


def _user_options_parse(options: Sequence[str]) -> list[tuple[str, str]] | None:
    try:
        parsed, rest = _getopt(options)
    except getopt.GetoptError:
        return None
    return parsed if not rest else None


@PURE
@given(options=_USER_OPTIONS, path=_PATH, command=_COMMAND)
@example(options=["-p"], path="/s/b", command=["/bin/true"])  # took --hold as its partition
def test_sbatch_argv_keeps_ocistages_options_whatever_the_values(
        options: list[str], path: str, command: list[str]) -> None:
    """``submit``'s held job: --container and --wrap each one word, --hold before the user's
    options; the user's parse as they do alone (or sbatch refuses them as it would alone)."""
    try:
        check_options(options)
        container = check_container_path(Path(path))
        wrap = wrap_command(command)
    except UsageError as exc:
        _refused_cleanly(exc)
        return
    argv = sbatch_argv(held_job_options(options), container=container, wrap=wrap)
    alone = _user_options_parse(options)
    try:
        parsed, rest = _getopt(argv[1:])
    except getopt.GetoptError:
        assert alone is None  # the user's own mistake, refused by sbatch as it would be alone
        return
    assert parsed[:4] == [("--parsable", ""), ("--container", str(container)),
                          ("--wrap", wrap), ("--hold", "")]
    if alone is not None:
        assert parsed[4:] == alone and rest == []


@PURE
@given(options=_USER_OPTIONS, path=_PATH, command=_COMMAND)
@example(options=["-p"], path="/s/b", command=["/bin/true"])  # took --container=...
@example(options=[], path="/s/b", command=["--output=/home/u/.bashrc"])  # srun's option
def test_srun_argv_never_makes_a_command_word_an_option(
        options: list[str], path: str, command: list[str]) -> None:
    """``submit --srun``: --container first, the command after ``--``: an image's
    ``--output=...`` Entrypoint is a word of the command, never srun's option."""
    require_binary("srun")
    try:
        check_options(options)
        container = check_container_path(Path(path))
        words = check_command(command)
    except UsageError as exc:
        _refused_cleanly(exc)
        return
    argv = srun_argv(options, container=container, command=words)
    # whatever the user's options, the container comes first and the command after --
    assert argv[1] == f"--container={container}" and argv[-len(words) - 1:] == ["--", *words]
    alone = _user_options_parse(options)
    if alone is not None:
        parsed, rest = _getopt(argv[1:])
        assert parsed == [("--container", str(container)), *alone]
        assert rest == words


@PROPERTY
@given(command=st.lists(st.one_of(benign("word"), hostile("word")), min_size=1, max_size=4))
def test_wrap_text_runs_exactly_the_words(command: list[str]) -> None:
    """``sbatch --wrap`` text, run by the real sh: the program gets exactly the words; the
    script's first line after sbatch's header is a command, so sbatch reads no #SBATCH line
    out of a word (sbatch/opt.c _opt_batch_script)."""
    printer = ["/usr/bin/printf", "%s\\0"]
    try:
        text = wrap_command([*printer, *command])
    except UsageError as exc:
        _refused_cleanly(exc)
        assert any("\0" in word or not encodable(word) for word in command)
        return
    script = f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{text}\n"
    first = next(line for line in script.split("\n")[1:] if line.strip()
                 and not line.lstrip().startswith("#"))
    assert first.startswith("exec ") and not any(
        line.startswith(("#SBATCH", "#SLURM")) for line in script.split("\n")[:3])
    result = _run(["/bin/sh", "-c", text])
    assert result.returncode == 0, result.stderr
    words = [w.decode("utf-8", "surrogateescape") for w in result.stdout.split(b"\0")[:-1]]
    assert words == command
    assert shlex.split(text)[1:] == [*printer, *command]


def test_command_refusals_are_clean() -> None:
    for command in (["--output=/home/u/.bashrc", "x"], ["-"], ["/bin/true", "a\0b"],
                    ["/bin/true", "\ud800"]):
        with pytest.raises(UsageError) as raised:
            wrap_command(command)
        _refused_cleanly(raised.value)
    for option in ("--wra=x", "--wr", "--containe=/x", "--container-id=x", "--wrap"):
        with pytest.raises(UsageError):
            check_options([option])
    check_options(["-c", "4", "--wait", "--cpus-per-task=2", "--contiguous"])


@PURE
@given(options=_USER_OPTIONS, job=st.from_regex(r"\A[1-9][0-9]{0,7}\Z"), path=_PATH,
       cache_root=_PATH, node=st.one_of(benign("word"), hostile("word", exclude=["nul"])),
       partition=st.one_of(benign("option"), hostile("option", exclude=["nul"])))
def test_cleanup_jobs_options_and_wrap_keep_their_structure(
        options: list[str], job: str, path: str, cache_root: str, node: str,
        partition: str) -> None:
    """The afterany cleanup jobs (``submit``'s and scrun's): every option is one
    ``--name=value`` word, the user's placement values carried whole; the wrap text gives back
    the exact argv."""
    for built in (cleanup_options(options, job),
                  cleanup_job_options(job, node=node,
                                      environ={"SLURM_JOB_PARTITION": partition})):
        assert all(re.match(r"\A--[a-z-]+=", word) for word in built), built
    assert f"--partition={partition}" in cleanup_job_options(
        job, node=None, environ={"SLURM_JOB_PARTITION": partition})
    for argv in (unstage_command(("/usr/bin/python3", "-P", "-m", "ocistage"), Path(path),
                                 job, Path(cache_root)),
                 stage_out_command(Path(path), Path(cache_root), ("/usr/bin/python3",))):
        try:
            text = wrap_command(argv)
        except UsageError as exc:
            _refused_cleanly(exc)
            return
        assert shlex.split(text) == ["exec", *argv]


@PROPERTY
@given(path=_PATH)
@example(path="/scratch/my jobs/b1")
def test_container_path_is_one_shell_word_for_slurmstepd(path: str) -> None:
    """slurmstepd writes the bundle path unquoted into RunTimeRun (``%b``, run by /bin/sh -c):
    a path that reaches it is one word there."""
    try:
        check_container_path(Path(path))
    except UsageError as exc:
        _refused_cleanly(exc)
        return
    result = _run(["/bin/sh", "-c", f'printf "%s\\0" run -b {Path(path)} id'])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(b"\0")[:-1] == [b"run", b"-b", os.fsencode(Path(path)), b"id"]


@PURE
@given(bundle=st.one_of(benign("path"), hostile("path", exclude=["nul"])))
def test_the_suggested_runc_command_line_names_the_bundle_as_one_word(bundle: str) -> None:
    """The ``runc --root ... run -b BUNDLE NAME`` a notice suggests (``bundle``): a shell
    gives back the bundle path as one word."""
    words = shlex.split(user_run_command(Path(bundle).absolute()))
    assert words == ["runc", "--root", "$HOME/.local/state/runc", "run", "-b",
                     str(Path(bundle).absolute()), "NAME"]


# -- the generated Lua ---------------------------------------------------------------------------


def _lua_opcodes(text: str) -> list[str]:
    """luac5.3's listing of ``text`` as opcode names (what runs, whatever the constants)."""
    luac = require_binary("luac5.3")
    result = _run([luac, "-l", "-p", "-"], text.encode("utf-8", "surrogateescape"))
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return re.findall(r"^\t\d+\t\[\d+\]\t(\w+)", result.stdout.decode("latin-1"), re.M)


@cache
def _benign_lua_opcodes(cache_set: bool, sbatch_set: bool) -> tuple[str, ...]:
    return tuple(_lua_opcodes(render_scrun_lua(ScrunLuaOptions(
        ocistage=("/usr/bin/ocistage",), stage_dir="/scratch/stage",
        cache="/c" if cache_set else None, sbatch="/usr/bin/sbatch" if sbatch_set else None))))


@PROPERTY
@given(text=st.one_of(benign("word"), hostile_text()))
@example(text="/scratch/caf\udce9")  # a UnicodeEncodeError
def test_lua_string_is_the_value_as_one_lua_string(text: str) -> None:
    """Lua reads back exactly the bytes of the value (non-UTF-8 as the bytes it stands for)."""
    lua = require_binary("lua5.3")
    literal = lua_string(text)
    assert literal.isascii() and literal.isprintable()
    result = _run([lua, "-e", f"io.write({literal})"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == text.encode("utf-8", "surrogateescape")


@PROPERTY
@given(field=st.sampled_from(["ocistage", "stage_dir", "cache", "sbatch"]),
       value=hostile("path"))
@example(field="ocistage", value="@CACHE@")  # the --cache value was substituted into it
def test_scrun_lua_keeps_its_structure(field: str, value: str) -> None:
    """A hostile ``--ocistage``, ``--stage-dir``, ``--cache`` or ``--sbatch`` (a path holding
    ``@CACHE@`` was substituted again, into Lua code): luac accepts the script and compiles it
    to the same instructions as with benign values -- the value is one string constant."""
    options: dict[str, Any] = {"ocistage": ("/usr/bin/ocistage",),
                               "stage_dir": "/scratch/stage", "cache": "/c",
                               "sbatch": "/usr/bin/sbatch"}
    options[field] = (value,) if field == "ocistage" else value
    try:
        text = render_scrun_lua(ScrunLuaOptions(**options))
    except UsageError as exc:
        _refused_cleanly(exc)
        return
    assert text.isascii()
    assert _lua_opcodes(text) == list(_benign_lua_opcodes(bool(options["cache"]),
                                                          bool(options["sbatch"])))


_LUA_DRIVER = r"""
slurm = {SUCCESS = 0, ERROR = -1}
for _, name in ipairs({"log_error", "log_info", "log_debug", "log_verbose",
		"set_bundle_path", "set_root_path"}) do
	slurm[name] = function() end
end
function slurm.allocator_command(command)
	local pipe = io.popen(command, "r")
	io.stdout:write(pipe:read("a"))
	pipe:close()
	return 0, '{"bundle": "/b"}'
end
package.loaded.cjson = {decode = function() return {bundle = "/b"} end,
	encode = function() return "{}" end}
dofile(arg[1])
os.exit(slurm_scrun_stage_out("id", arg[2], "/orig", arg[3], "rootfs", "/spool",
	"/spool/config.json", 1, 0, 0) == slurm.SUCCESS and 0 or 1)
"""


@PROPERTY
@given(bundle=hostile("path", exclude=["nul"]), root=hostile("path", exclude=["nul"]),
       cache_dir=st.one_of(benign("path"), hostile("path", exclude=["nul"])))
def test_scrun_lua_hands_the_shell_each_value_as_one_word(
        tmp_path_factory: pytest.TempPathFactory, bundle: str, root: str,
        cache_dir: str) -> None:
    """The hooks' command line (Lua ``quote``, run by scrun through sh): the paths scrun passes
    and the generated ones arrive as exactly the words they were."""
    lua = require_binary("lua5.3")
    printer = ("/bin/sh", "-c", 'printf "%s\\0" "$@"', "sh")
    try:
        text = render_scrun_lua(ScrunLuaOptions(ocistage=printer, stage_dir="/s",
                                                cache=cache_dir))
    except UsageError as exc:
        _refused_cleanly(exc)
        return
    script = tmp_path_factory.mktemp("lua") / "scrun.lua"
    script.write_text(text)
    driver = script.with_name("driver.lua")
    driver.write_text(_LUA_DRIVER)
    result = _run([lua, str(driver), str(script), bundle, root])
    assert result.returncode == 0, result.stderr
    words = [w.decode("utf-8", "surrogateescape") for w in result.stdout.split(b"\0")[:-1]]
    assert words == ["scrun", "stage-out", "--bundle", bundle, "--root-path", root,
                     *(["--cache", cache_dir] if cache_dir else [])]


# -- oci.conf ------------------------------------------------------------------------------------

#: Slurm's s_p_parse_line key=value pattern (src/common/parse_config.c keyvalue_pattern)
_KEYVALUE = re.compile(r'[ \t\n\r\f\v]*([A-Za-z0-9_.]+)[ \t\n\r\f\v]*([-*+/]?)='
                       r'[ \t\n\r\f\v]*(("([^"]*)")|([^ \t\n\r\f\v]+))([ \t\n\r\f\v]|$)')


def _slurm_lines(text: str) -> list[str]:
    """oci.conf's lines as Slurm reads them: comments cut at a ``#`` after an even number of
    backslashes (quoted or not), a line ending in an odd number continued, ``\\x`` -> ``x``."""
    lines, pending = [], ""
    for raw in text.split("\n"):
        backslashes = 0
        for index, char in enumerate(raw):
            if char == "#" and backslashes % 2 == 0:
                raw = raw[:index]
                break
            backslashes = backslashes + 1 if char == "\\" else 0
        stripped = raw.rstrip()
        trailing = len(stripped) - len(stripped.rstrip("\\"))
        if trailing % 2:
            pending += stripped[:-1]
            continue
        line, pending = pending + raw, ""
        lines.append(re.sub(r"\\(.)", r"\1", line, flags=re.S))
    return lines


def _slurm_parse(text: str) -> list[tuple[str, str]]:
    """Every key and value Slurm's parser takes out of ``text``, in order; a line it cannot
    parse is ("?", line)."""
    pairs = []
    for line in _slurm_lines(text):
        rest = line
        while rest.strip():
            match = _KEYVALUE.match(rest)
            if match is None:
                pairs.append(("?", rest))
                break
            value = match.group(5) if match.group(5) is not None else match.group(6)
            pairs.append((match.group(1).lower(), value))
            rest = rest[match.end(3):]
    return pairs


#: what slurmstepd puts in for each token (container.c _generate_pattern), one per release
_EXPANSIONS = {"%": "%", "b": "/stage/b1", "e": "/spool/env", "j": "42", "m": "/spool",
               "n": "node1", "p": "4242", "r": "/stage/b1/rootfs", "s": "0", "t": "0",
               "u": "alice", "U": "1000", "Z": "/home/alice"}


def _expand(pattern: str, version: SlurmVersion) -> str:
    out, index = [], 0
    while index < len(pattern):
        char = pattern[index]
        if char != "%":
            out.append(char)
            index += 1
            continue
        token = pattern[index + 1:index + 2]
        assert token in known_tokens(version), f"slurmstepd {version}: fatal %{token}"
        out.append("'arg one' 'arg two'" if token == "@" else _EXPANSIONS[token])
        index += 2
    return "".join(out)


def _shell_words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True  # words end at blanks and operators only, as in sh
    return list(lexer)


def _conf_structure(text: str, version: SlurmVersion) -> list[tuple[str, list[str]]]:
    return [(key, _shell_words(_expand(value, version)) if key.startswith("runtime") and
             key != "runtimeenvexclude" else [value])
            for key, value in _slurm_parse(text)]


@PURE
@given(runtime=st.sampled_from(["runc", "crun", "nvidia-container-runtime"]),
       version=st.sampled_from(VERSIONS), field=st.sampled_from(["root", "srun_path"]),
       value=st.one_of(hostile("path"), benign("path").map(lambda p: p + "-%u")))
@example(runtime="runc", version=SlurmVersion(24, 5), field="root", value="/x#y")
@example(runtime="runc", version=SlurmVersion(24, 5), field="root", value="/r/%x")
@example(runtime="crun", version=SlurmVersion(22, 5), field="root", value="/r/%U")
@example(runtime="runc", version=SlurmVersion(24, 5), field="srun_path", value="/a#/srun")
def test_oci_conf_values_keep_their_key_and_word(runtime: str, version: SlurmVersion,
                                                 field: str, value: str) -> None:
    """``--root`` and the srun path in oci.conf: read by Slurm's parser (comments, quotes,
    escapes, more keys on a line) and expanded as slurmstepd does, the file has the benign
    file's keys, and each RunTime* command the benign shell words, the root as one word."""
    benign_options = OciConfOptions(runtime=runtime, root="/run/oci", version=version,
                                    srun_path="/usr/bin/srun")
    options = (dataclasses.replace(benign_options, root=value) if field == "root"
               else dataclasses.replace(benign_options, srun_path=value))
    try:
        text = render_oci_conf(options)
    except UsageError as exc:
        _refused_cleanly(exc)
        return
    assert lint_oci_conf(text, version) == []
    expected = _conf_structure(render_oci_conf(benign_options), version)
    got = _conf_structure(text, version)
    assert [key for key, _ in got] == [key for key, _ in expected]
    for (key, words), (_, benign_words) in zip(got, expected, strict=True):
        assert len(words) == len(benign_words), (key, words)
        if field == "root" and key.startswith("runtime") and "--root=/run/oci" in benign_words:
            assert f"--root={_expand(value, version)}" in words
        if key == "srunpath":
            assert words == [options.srun_path]


@PROPERTY
@given(line=hostile_bytes(), version=st.sampled_from(VERSIONS))
def test_oci_conf_linter_reads_any_bytes(tmp_path_factory: pytest.TempPathFactory, line: bytes,
                                         version: SlurmVersion) -> None:
    """``oci-conf --check`` of a file with a hostile line (bytes): problems, never a crash."""
    path = tmp_path_factory.mktemp("conf") / "oci.conf"
    path.write_bytes(render_oci_conf(OciConfOptions(version=version)).encode() + line + b"\n")
    problems = lint_oci_conf_file(path, version)
    assert all(str(problem) for problem in problems)


def test_oci_conf_refusals_name_the_problem() -> None:
    for root in ("/x#y", "/x y", "relative", "-x", "/x\\y", '/x"y', "/r/%p", "/r/%b", "/%",
                 "/r/%Z", "/x\udcff", "/x\ny", "/x\0y", "/r/$(id)"):
        with pytest.raises(UsageError) as raised:
            render_oci_conf(OciConfOptions(root=root, version=SlurmVersion(24, 5)))
        _refused_cleanly(raised.value)
    assert "--root=/r/%Z " in render_oci_conf(OciConfOptions(root="/r/%Z",
                                                             version=SlurmVersion(26, 5)))


# -- podman-config, docker-config ----------------------------------------------------------------


@PURE
@given(scrun=st.one_of(benign("path"), hostile("path")))
@example(scrun="/opt/a:b/scrun")  # two more entries in conmon's PATH
@example(scrun="/opt/x\r/scrun")  # not TOML
def test_engine_configs_carry_the_scrun_path_as_one_value(scrun: str) -> None:
    """daemon.json (JSON) and containers.conf (TOML) parse, name the scrun path exactly, and
    conmon's PATH has one more entry than Podman's default at most (scrun's directory)."""
    try:
        docker = docker_daemon_json(scrun)
        podman = podman_containers_conf(scrun)
    except UsageError as exc:
        _refused_cleanly(exc)
        return
    assert json.loads(docker)["runtimes"] == {"slurm": {"path": scrun}}
    conf = tomllib.loads(podman)
    benign_conf = tomllib.loads(podman_containers_conf("/usr/bin/scrun"))
    assert conf["engine"]["runtimes"] == {"slurm": [scrun]}
    assert conf.keys() == benign_conf.keys()
    assert conf["engine"].keys() == benign_conf["engine"].keys()
    (path,) = conf["engine"]["conmon_env_vars"]
    assert path == f"PATH={conmon_path(scrun)}"
    assert len(path.split(":")) - len(benign_conf["engine"]["conmon_env_vars"][0].split(
        ":")) in (0, 1)


# -- the man page --------------------------------------------------------------------------------


def _groff_lines(page: str) -> list[str]:
    groff = require_binary("groff")
    result = _run([groff, "-man", "-Tutf8", "-k", "-P-cbou", "-rLL=5000n", "-ww"],
                  page.encode())
    assert result.returncode == 0 and not result.stderr, result.stderr
    lines = result.stdout.decode().split("\n")
    start = lines.index("BODY") + 1
    end = max(i for i, line in enumerate(lines) if line.strip().startswith("T(1)")) - 1
    body = lines[start:end]
    while body and not body[-1].strip():
        body.pop()
    return [" ".join(line.split()) for line in body]


@PROPERTY
@given(lines=st.lists(st.one_of(benign("word"), hostile_text(exclude=["long"])),
                      min_size=1, max_size=5))
@example(lines=["one\x85two"])  # two lines of one
@example(lines=["a\x1bb"])  # groff dropped the ESC without a word
def test_man_page_shows_help_text_lines_as_they_are(lines: list[str]) -> None:
    """A help text in ocistage(1) (``roff``, rendered by groff): the same lines, each as it
    is -- no request, escape or font change out of a dot, quote or backslash; or refused."""
    text = "\n".join(["first", *lines, "last"])
    try:
        page = '.TH T 1\n' + section("BODY", text)
    except UsageError as exc:
        _refused_cleanly(exc)
        return
    assert _groff_lines(page) == [" ".join(line.split()) for line in text.split("\n")]


# -- the command line: one error line, exit 2 ------------------------------------------------------

_CLI_CASES: list[tuple[list[str], str]] = [
    (["runtime", "oci-conf", "--slurm-version", "24.05", "--root", "/x#y"], "runtime root"),
    (["runtime", "oci-conf", "--slurm-version", "22.05", "--root", "/run/%U"], "%U"),
    (["runtime", "podman-config", "--scrun", "/opt/a:b/scrun"], "absolute and plain"),
    (["runtime", "docker-config", "--scrun", "/opt/\x1b[31m/scrun"], "absolute and plain"),
    (["submit", "oci:/nonexistent:x", "--stage-to", "/tmp/s", "--wra=evil", "--", "true"],
     "is set by ocistage submit"),
]


@pytest.mark.parametrize(("argv", "said"), _CLI_CASES,
                         ids=[" ".join(argv[:2]) + f"-{i}" for i, (argv, _) in
                              enumerate(_CLI_CASES)])
def test_cli_refuses_with_one_error_line(argv: list[str], said: str, cli: Cli) -> None:
    outcome = cli(*argv)
    code, err = outcome.returncode, outcome.stderr
    assert code == 2, err
    assert [line for line in err.splitlines() if line.startswith("error:")] == \
        [err.splitlines()[0]]
    assert said in err and "Traceback" not in err


def test_cli_scrun_lua_takes_a_non_utf8_stage_dir(cli: Cli) -> None:
    """A directory name that is not UTF-8 (as argv gives it) is written as its bytes."""
    outcome = cli("runtime", "scrun-lua", "--slurm-version", "24.05", "--no-cleanup-job",
                         "--ocistage", "/usr/bin/ocistage", "--stage-dir",
                         "/scratch/caf\udce9 @CACHE@")
    out = outcome.stdout
    assert outcome.returncode == 0, outcome.stderr
    assert 'local STAGE_DIR = "/scratch/caf\\233 @CACHE@"' in out
    assert _lua_opcodes(out) == list(_benign_lua_opcodes(False, False))

