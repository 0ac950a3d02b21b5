"""Exit statuses as docs/cli.md gives them: 2 for every mistake on the command line (a source,
target, name or path that cannot be right), 141 and nothing on stderr when stdout's reader has
gone (as ``ls`` killed by SIGPIPE), 130 with an error and a hint for Ctrl-C."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ocistage.bundler.cli.failure import CLOSED_STDOUT
from pytest_ocistage.components import require_binary
from tests.bundler.clirun import Cli, cli
from tests.stagers.conftest import make_tree

__all__ = ["cli"]  # the fixture


def _error(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 2 and lines[1].startswith("hint: "), stderr
    return lines[0]


def test_stage_mistakes_exit_2_as_bundle_mistakes_do(cli: Cli) -> None:
    tree = make_tree(cli.root / "tree")
    target = cli.root / "target"
    (cli.root / "afile").write_bytes(b"x")
    assert cli("bundle", "./nothere").exit_code == 2
    for argv, message in [
        (("stage", "mybundle", "--to", str(target)), "error: no such directory: mybundle"),
        (("stage", "./nothere", "--to", str(target)), "error: no such directory: ./nothere"),
        (("stage", "./afile", "--to", str(target)), "error: ./afile is not a directory"),
        (("stage", str(tree), "--name", "../escape", "--to", str(target)),
         "error: invalid staged name '../escape'"),
        (("stage", str(tree), "--to", str(cli.root / "afile")),
         f"error: the target {cli.root / 'afile'} is not a directory"),
        (("stage", str(tree), "--to", str(tree / "inside")),
         f"error: the target {tree / 'inside'} is inside the source {tree}"),
    ]:
        outcome = cli(*argv)
        assert (outcome.exit_code, _error(outcome.stderr)) == (2, message), argv


def test_unstage_of_nothing_is_an_error(cli: Cli) -> None:
    outcome = cli("unstage", str(cli.root / "no" / "such"))
    assert outcome.exit_code == 2
    assert _error(outcome.stderr) == f"error: nothing is staged at {cli.root / 'no' / 'such'}"
    # unless told that it may be gone (a job's cleanup after a cache gc)
    quiet = cli("unstage", "--missing-ok", str(cli.root / "no" / "such"))
    assert (quiet.exit_code, quiet.stderr) == (0, f"nothing was staged at {cli.root}/no/such\n")


def test_unstage_of_a_removed_bundle_releases_its_lease(cli: Cli) -> None:
    """A job's cleanup after somebody removed the bundle: no error, the lease goes."""
    tree = make_tree(cli.root / "tree")
    staged = cli("stage", str(tree), "--to", str(cli.root / "target"), "--pin", "p")
    assert staged.exit_code == 0, staged.stderr
    path = Path(staged.stdout.strip())
    for directory, _dirs, _files in os.walk(path):  # its read-only ones too, as chmod -R u+w
        os.chmod(directory, 0o700)
    shutil.rmtree(path)
    released = cli("unstage", str(path), "--pin", "p")
    assert released.exit_code == 0, released.stderr
    assert released.stderr == f"released the lease on {path} (already removed)\n"
    assert cli("unstage", str(path), "--pin", "p").exit_code == 2  # now nothing is left


def test_unstage_says_why_a_bundle_is_kept(cli: Cli) -> None:
    tree = make_tree(cli.root / "tree")
    target = str(cli.root / "target")
    path = cli("stage", str(tree), "--to", target, "--pin", "a").stdout.strip()
    assert cli("stage", str(tree), "--to", target, "--pin", "b").exit_code == 0
    kept = cli("unstage", path, "--pin", "a")
    assert kept.exit_code == 0
    assert kept.stderr.startswith(f"kept {path}: other jobs or pins still hold it")
    assert cli("unstage", path, "--pin", "b").stderr == f"removed {path}\n"


@pytest.mark.parametrize("argv", [["cache", "ls"], ["config", "show"], ["--help"],
                                  ["cache", "ls", "--json"]])
def test_a_closed_stdout_ends_quietly_as_sigpipe_does(argv: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "OCISTAGE_CACHE": str(tmp_path / "cache"),
           "OCISTAGE_CONFIG": str(tmp_path / "none.toml")}
    process = subprocess.Popen([sys.executable, "-m", "ocistage", *argv], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before anything is written
    code = process.wait(timeout=60)
    assert (code, process.stderr.read()) == (CLOSED_STDOUT, b"")


def test_pipefail_sees_what_it_sees_of_ls(tmp_path: Path) -> None:
    require_binary("bash")
    env = {**os.environ, "OCISTAGE_CACHE": str(tmp_path / "cache")}
    script = (f"set -o pipefail; {sys.executable} -m ocistage config show | (exec 0<&-); "
              "echo ocistage=$?; yes | (exec 0<&-); echo yes=$?")
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.stdout.split() == ["ocistage=141", "yes=141"], result.stderr
    assert result.stderr == ""


def test_ctrl_c_in_stage_is_an_error_with_a_hint(cli: Cli,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from ocistage.bundler.flows import stage as staging

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(staging, "stage", interrupted)
    outcome = cli("stage", str(cli.root), "--to", str(cli.root / "t"))
    assert outcome.exit_code == 130
    assert _error(outcome.stderr) == "error: interrupted"
    assert "run the command again" in outcome.stderr


@pytest.mark.parametrize(("argv", "message"), [
    (("--cache", "/x", "cache", "ls"), "error: --cache goes after the command"),
    (("-q", "pull", "x"), "error: -q goes after the command"),
    (("--nope", "pull", "x"), "error: no such option: --nope"),
])
def test_an_option_before_the_command_says_where_it_goes(cli: Cli, argv: tuple[str, ...],
                                                         message: str) -> None:
    outcome = cli(*argv)
    assert outcome.exit_code == 2
    error = _error(outcome.stderr)
    assert error == message and "Possible options" not in outcome.stderr
