"""The CLI's boundary: every exception becomes one ``error:`` line with a hint (a traceback only
with ``-v``), exit 1 for operational errors and 2 for usage errors, and what comes from outside
is printed with its control characters written out."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ocistage.bundler.cli.common import CliRenderer, summarize_warnings
from ocistage.bundler.cli.printable import sanitize
from ocistage.cache.notice import Kind, Notice
from pytest_ocistage.components import require_binary
from tests.bundler.clirun import Cli, cli
from tests.bundler.tarbuilder import build_tar, chardev, directory, file, write_oci_layout

__all__ = ["cli"]  # the fixture

ESC_LABEL = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\u202e"


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image with device nodes under /dev and hostile strings in its config."""
    path = tmp_path_factory.mktemp("layout") / "image"
    entries = [directory("dev"), *(chardev(f"dev/{name}", 1, minor) for minor, name in
                                   enumerate(["null", "zero", "full", "random", "urandom",
                                              "tty", "console", "ptmx"], start=3)),
               file("hello.txt", b"hello")]
    write_oci_layout(path, [build_tar(entries)], tag="v1", container={
        "Cmd": ["/bin/echo", "\x1b[31mcmd"], "Env": ["A=\x1b[1mbold"],
        "Labels": {"title\x1b[5m": ESC_LABEL}})
    return path


def _ref(layout: Path) -> str:
    return f"oci:{layout}:v1"


# -- what each kind of failure looks like ------------------------------------------------------


def _one_error(stderr: str) -> str:
    lines = stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr
    hints = [line for line in lines if line.startswith("hint: ")]
    assert len(hints) == 1, stderr
    return errors[0]


def test_an_ocistage_error_is_one_line_and_a_hint(cli: Cli) -> None:
    result = cli("cache", "rm", "127.0.0.1:5000/not/cached:1")
    assert result.exit_code == 1
    assert "is not in the cache" in _one_error(result.stderr)


@pytest.mark.parametrize(("argv", "message", "usage"), [
    (("bundle", "--nope", "x"), "no such option: --nope", "ocistage bundle [OPTIONS] {REF} [DEST]"),
    (("stage",), "missing argument 'REF|BUNDLE|DIR|URL'", "ocistage stage [OPTIONS]"),
    (("pull", "-j", "many", "x"), "invalid value for '--jobs' / '-j': 'many'", "ocistage pull"),
    (("frobnicate",), "no such command 'frobnicate'", "ocistage [OPTIONS] COMMAND"),
])
def test_command_line_mistakes_are_rendered_as_our_errors(
        cli: Cli, argv: tuple[str, ...], message: str, usage: str) -> None:
    outcome = cli(*argv)
    assert outcome.exit_code == 2
    error, hint = outcome.stderr.splitlines()
    assert error.startswith(f"error: {message}") and not error.endswith("."), error
    assert hint.startswith(f"hint: usage: {usage}"), hint
    assert hint.endswith(f"('{usage.split(' [')[0]} --help' for more)"), hint
    assert "Usage:" not in outcome.stderr and outcome.stdout == ""


def test_a_mistake_found_before_the_command_has_a_context_names_its_help(cli: Cli) -> None:
    outcome = cli("cache", "gc", "--max-size")
    assert outcome.exit_code == 2
    assert outcome.stderr.splitlines() == [
        "error: option '--max-size' requires an argument",
        "hint: 'ocistage cache gc --help' shows the usage"]


def test_a_group_without_its_command_prints_its_help(cli: Cli) -> None:
    outcome = cli("cache")
    assert outcome.exit_code == 2
    assert outcome.stderr.startswith("Usage: ocistage cache [OPTIONS] COMMAND")
    assert " gc " in outcome.stderr or "\n  gc" in outcome.stderr


def test_a_usage_error_exits_2(cli: Cli, layout: Path) -> None:
    assert cli("bundle", "not a reference").exit_code == 2
    assert cli("pull", "--jobs", "0", _ref(layout)).exit_code == 2
    assert cli("cache", "gc", "--max-size", "lots").exit_code == 2
    assert cli("nosuchcommand").exit_code == 2


@pytest.mark.parametrize("exception", [RuntimeError("boom \x1b[2J"), OSError(5, "I/O error"),
                                       PermissionError(13, "Permission denied", "/x/y")])
def test_any_exception_is_one_error_line(cli: Cli, layout: Path,
                                         monkeypatch: pytest.MonkeyPatch,
                                         exception: Exception) -> None:
    """A fault the library did not translate (a bug) is still one line, traceback with -v."""
    from ocistage.bundler import pull as pull_module

    def broken(*args: object, **kwargs: object) -> None:
        raise exception

    monkeypatch.setattr(pull_module, "pull", broken)
    result = cli("pull", _ref(layout))
    assert result.exit_code == 1
    line = _one_error(result.stderr)
    assert "\x1b" not in result.stderr
    if isinstance(exception, OSError):
        assert line.startswith(f"error: {exception.strerror}")
        if exception.filename:
            assert line.endswith(": /x/y")
    else:
        assert line == "error: internal error: RuntimeError: boom \\x1b[2J"
    verbose = cli("pull", "-v", _ref(layout))
    assert verbose.exit_code == 1 and "Traceback" in verbose.stderr


def test_interrupted_exits_130(cli: Cli, layout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ocistage.bundler import pull as pull_module

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pull_module, "pull", interrupted)
    result = cli("pull", _ref(layout))
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert "Traceback" not in result.stderr


def test_path_like_references_are_not_sent_to_a_registry(cli: Cli) -> None:
    (cli.root / "mybundle").mkdir()
    for command in ("pull", "bundle", "inspect"):
        missing = cli(command, "./mybundel")
        assert missing.exit_code == 2
        assert _one_error(missing.stderr) == "error: no such file or directory: ./mybundel"
        absolute = cli(command, "/nonexistent/dir")
        assert _one_error(absolute.stderr) == "error: no such file or directory: /nonexistent/dir"
        there = cli(command, "./mybundle")
        assert _one_error(there.stderr) == "error: ./mybundle is a directory, not an image " \
                                           "reference"
        assert "oci:PATH" in there.stderr


# -- untrusted strings -------------------------------------------------------------------------


def test_sanitize_writes_out_control_characters() -> None:
    assert sanitize("a\x1b[31mb\x07c\x9bd\x7f\u202ee\tf\ng") == \
        "a\\x1b[31mb\\x07c\\x9bd\\x7f\\u202ee\tf\ng"
    assert sanitize("plain ünïcode") == "plain ünïcode"


@pytest.mark.parametrize("rich", [False, True])
def test_a_result_says_plain_text_and_the_renderer_makes_it_safe(
        rich: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """What a result tells the renderer (ocistage.results.Renderer) is plain text: control
    characters are written out and markup is shown as text; --quiet drops notes and details,
    not the result and not warnings."""
    monkeypatch.setenv("NO_COLOR", "1")
    for quiet in (False, True):
        out = CliRenderer(quiet=quiet, rich=rich)
        out.heading("[bold]\x1b[2Jname")
        out.line("a\x1b]0;t\x07b", faint=" (from [dim])")
        out.detail("detail")
        out.note("note \x1b[31m")
        out.warning("careful")
        stdout, stderr = capsys.readouterr()
        assert stdout == ("[bold]\\x1b[2Jname\na\\x1b]0;t\\x07b (from [dim])\n"
                          + ("" if quiet else "detail\n")), (rich, quiet)
        assert stderr == ("" if quiet else "note \\x1b[31m\n") + "warning: careful\n"


def test_image_config_values_reach_the_terminal_escaped(cli: Cli, layout: Path) -> None:
    result = cli("inspect", _ref(layout))
    assert result.exit_code == 0, result.stderr
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout
    assert "label:      title\\x1b[5m=\\x1b]0;owned\\x07\\x1b[2J\\x1b[31mred\\u202e" \
        in result.stdout
    assert "env:        A=\\x1b[1mbold" in result.stdout
    as_json = cli("inspect", "--json", _ref(layout))
    assert "\x1b" not in as_json.stdout
    labels = json.loads(as_json.stdout)["config"]["config"]["labels"]
    assert labels == {"title\x1b[5m": ESC_LABEL}  # JSON keeps the data, escaped as JSON does


def test_error_messages_from_outside_are_escaped(cli: Cli) -> None:
    """A registry's error message is part of an error; the boundary escapes every error."""
    from ocistage.bundler.cli.app import render_error

    cli.capsys.readouterr()
    render_error("registry said: \x1b[2Jgone", "hint \x1b]0;title\x07")
    err = cli.capsys.readouterr().err
    assert err == "error: registry said: \\x1b[2Jgone\nhint: hint \\x1b]0;title\\x07\n"


# -- warnings ----------------------------------------------------------------------------------


def test_device_nodes_are_one_warning_line_and_none_with_quiet(cli: Cli, layout: Path) -> None:
    """A Debian-based image printed 8 warnings about /dev nodes, even with -q."""
    result = cli("bundle", _ref(layout), str(cli.root / "b1"))
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: 8 device nodes (as under /dev) replaced by empty files: a "
                        "rootless bundle cannot hold them (the runtime provides /dev)"]
    quiet = cli("bundle", "-q", _ref(layout), str(cli.root / "b2"))
    assert quiet.exit_code == 0 and quiet.stderr == ""
    as_json = cli("bundle", "--json", _ref(layout), str(cli.root / "b3"))
    listed = json.loads(as_json.stdout)["warnings"]
    assert len([w for w in listed if "character device" in w]) == 8
    staged = cli("stage", "-q", _ref(layout), "--to", str(cli.root / "staged"))
    assert staged.exit_code == 0 and staged.stderr == ""


def test_other_warnings_are_kept() -> None:
    warnings = [Notice(Kind.DEVICE_NODE, "/dev/null: character device 1:3 replaced by an "
                       "empty file (rootless)", 1), Notice(Kind.SKIPPED, "skipped /x: odd", 2),
                Notice(Kind.DEVICE_NODE, "/dev/zero: character device 1:5 replaced by an "
                       "empty file (rootless)", 1)]
    assert summarize_warnings(warnings, quiet=True) == ["layer 2: skipped /x: odd"]
    assert summarize_warnings(warnings) == [
        "layer 2: skipped /x: odd",
        "2 device nodes (as under /dev) replaced by empty files: a rootless bundle cannot hold "
        "them (the runtime provides /dev)"]


# -- version and completion --------------------------------------------------------------------


def test_version(cli: Cli) -> None:
    result = cli("--version")
    assert result.exit_code == 0
    assert result.stdout == f"ocistage {version('ocistage')}\n"


def _ocistage_script() -> str:
    beside = Path(sys.executable).parent / "ocistage"
    found = str(beside) if beside.exists() else shutil.which("ocistage")
    if found is None:
        pytest.skip("the ocistage console script is not installed")
    return found


def test_bash_completion_completes_commands_and_options(tmp_path: Path) -> None:
    require_binary("bash")
    script = _ocistage_script()
    env = {**os.environ, "PATH": f"{Path(script).parent}:{os.environ['PATH']}",
           "HOME": str(tmp_path)}
    probe = ('source <(ocistage --show-completion bash)\n'
             'complete -p ocistage\n'
             'for words in "ocistage ca" "ocistage cache g" "ocistage pull --ins"; do\n'
             '  COMP_WORDS=($words); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n'
             '  _ocistage_completion ocistage; echo "[${COMPREPLY[*]}]"\n'
             'done\n')
    result = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "_ocistage_completion" in lines[0]
    assert lines[1:] == ["[cache]", "[gc]", "[--insecure-registry]"]


# -- no input reaches a traceback --------------------------------------------------------------

def _command_options() -> dict[tuple[str, ...], tuple[list[str], list[str]]]:
    """Each command's (flags, options taking a value), read from the CLI itself."""
    import typer.main

    from ocistage.bundler.cli.app import app

    found: dict[tuple[str, ...], tuple[list[str], list[str]]] = {}

    def walk(command: Any, path: tuple[str, ...]) -> None:
        flags = [o for p in command.params if getattr(p, "is_flag", False)
                 for o in [*p.opts, *p.secondary_opts]
                 # srun; writes ~/.bashrc; answers from the parent shell (typer's "Shell sh
                 # not supported." where it is no shell it knows), not from the input:
                 # test_bash_completion_completes_commands_and_options covers it
                 if o not in ("--all-nodes", "--install-completion", "--show-completion")]
        valued = [o for p in command.params
                  if p.param_type_name == "option" and not getattr(p, "is_flag", False)
                  for o in p.opts]
        found[path] = ([*flags, "--help"], valued)
        names = command.list_commands(None) if hasattr(command, "list_commands") else []
        for name in names:  # the lazy top-level group builds each command when asked
            if name not in ("submit", "unstage", "scrun"):  # Slurm; removal of given paths
                walk(command.get_command(None, name), (*path, name))

    walk(typer.main.get_command(app), ())
    return found


_OPTIONS = _command_options()
_COMMANDS = [list(path) for path in _OPTIONS] + [["nosuch"]]
_FLAGS = sorted({flag for flags, _ in _OPTIONS.values() for flag in flags} | {"--"})
_VALUED = sorted({option for _, valued in _OPTIONS.values() for option in valued})
# text that stays inside the working directory when it is used as a path
_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20).map(
    lambda t: "x" + t if t.startswith(("/", "~", "-")) or ".." in t else t)
_SIZES = st.sampled_from(["0", "1", "500M", "1.5T", "-1", "1e400", "9" * 40, "big", ""])


@st.composite
def _references(draw: st.DrawFn, layout: Path) -> str:
    text = draw(_TEXT)
    return draw(st.sampled_from([
        f"oci:{layout}:v1", f"oci:{layout}", f"oci:{layout}:{text}", f"oci:{text}",
        f"oci-archive:{text}", f"docker-archive:{text}", f"docker-archive:{layout}",
        f"oci-archive:{layout}/index.json", f"./{text}", f"/nonexistent-ocistage/{text}",
        f"~/{text}", f"127.0.0.1:9/{text}", f"127.0.0.1:9/repo@sha256:{text}",
        f"docker://{text}", text, f"{layout}",
    ]))


_TAKES_REF = [["pull"], ["bundle"], ["inspect"], ["stage"], ["cache", "rm"]]


@st.composite
def _argv(draw: st.DrawFn, layout: Path) -> list[str]:
    argv = list(draw(st.sampled_from(_COMMANDS)))
    if argv in _TAKES_REF and draw(st.integers(0, 3)):
        argv.append(draw(_references(layout)))  # mostly: the command's REF first
    own_flags, own_valued = _OPTIONS.get(tuple(argv[:2]), _OPTIONS.get(tuple(argv[:1]),
                                                                       ([], [])))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.integers(0, 9))  # mostly options: a stray argument is a usage error
        if kind <= 4:
            flags = own_flags if own_flags and draw(st.integers(0, 4)) else _FLAGS
            argv.append(draw(st.sampled_from(flags)))
        elif kind <= 7:
            valued = own_valued if own_valued and draw(st.integers(0, 4)) else _VALUED
            option = draw(st.sampled_from(valued))
            value = draw(st.sampled_from(["never", "sometimes"])) if option == "--pull" \
                else draw(_SIZES) if option in ("--max-size", "--jobs", "-j") \
                else draw(_TEXT)
            argv += [option, value]
        elif kind == 8:
            argv.append(draw(_references(layout)))
        else:
            argv.append(draw(_TEXT))
    return argv


_CONFIG_LINES = st.sampled_from([
    "", "", "", "", "", "", "", "",  # mostly no config file: other inputs get their turn
    'jobs = "x"', "jobs = 3", "cache = 5", 'cache = "c2"', "jobz = 1", "max_size = -3",
    'max_size = "2G"', 'pull = "always"', 'pull = "sometimes"', "registries = 5",
    '[registries."r:1"]\ninsecure = 1', '[registries."r:1"]\nmirrors = ["ftp://x"]', "= broken",
    'stage_to = "staged"', 'ca_file = "\\u001b[31m"',
])


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=st.data())
def test_no_input_reaches_a_traceback(cli: Cli, layout: Path, data: st.DataObject,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Random commands, options, references, config files and environment variables: every
    run ends in a result, an ``error:`` line with a hint (1 or 2), or typer's usage message
    (2); never an internal error, never a raw escape character. ``$OCISTAGE_PULL=never``
    keeps registries out of reach except for inspect, whose registry references all point
    at 127.0.0.1:9."""
    cli.config.write_text(data.draw(_CONFIG_LINES) + "\n")
    monkeypatch.setenv("OCISTAGE_PULL", data.draw(st.sampled_from(["never"] * 5 + ["often"])))
    for name, values in (("OCISTAGE_MAX_SIZE", _SIZES),
                         ("OCISTAGE_INSECURE_REGISTRIES", _TEXT.filter(lambda t: "\x00" not in t)),
                         ("OCISTAGE_STAGE_TO", _TEXT)):
        if data.draw(st.integers(0, 3)) == 0:
            monkeypatch.setenv(name, data.draw(values))
        else:
            monkeypatch.delenv(name, raising=False)
    argv = data.draw(_argv(layout))
    if argv[:1] == ["inspect"] and any("127.0.0.1" in a for a in argv):
        argv = [a.replace("127.0.0.1:9", "oci:") for a in argv]  # no retries against a port
    result = cli(*argv)
    event(f"{' '.join(argv[:2])}: exit {result.exit_code}")
    assert result.exit_code in (0, 1, 2), (argv, result)
    assert "internal error" not in result.stderr, (argv, result.stderr)
    assert "\x1b" not in result.stdout + result.stderr, argv
    if not {"-v", "--verbose"} & set(argv):
        assert "Traceback" not in result.stderr, (argv, result.stderr)
    if result.exit_code == 1:
        assert re.search(r"^error: ", result.stderr, re.MULTILINE), (argv, result.stderr)


def test_log_lines_of_verbose_runs_are_escaped(tmp_path: Path) -> None:
    code = ("import logging; from ocistage.bundler.cli.common import setup_logging; "
            "setup_logging(True); "
            "logging.getLogger('ocistage.x').warning('registry said %s', '\\x1b[2Jgone')")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=True)
    assert result.stderr == "WARNING ocistage.x: registry said \\x1b[2Jgone\n"
