"""The one rule of what a failed command tells its user (ocistage.bundler.cli.failure), in
both programs' voices: ``ocistage`` and ``ocistage-pyxis-importer``."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ocistage.bundler.cli.app import VOICE as CLI
from ocistage.bundler.cli.failure import (
    CLOSED_STDOUT,
    ClosedStdout,
    Failure,
    PipeError,
    failure,
    write_failure,
)
from ocistage.bundler.pyxis.main import VOICE as IMPORTER
from ocistage.errors import OcistageError, UsageError


def test_errors_of_the_library_are_their_message_and_hint() -> None:
    error = OcistageError("no such image", "pass --insecure-registry HOST:PORT")
    assert failure(error, CLI) == Failure("no such image", "pass --insecure-registry HOST:PORT",
                                          1, cause=error)
    said = failure(error, IMPORTER)
    assert said.hint is not None and "$OCISTAGE_INSECURE_REGISTRIES" in said.hint
    assert failure(UsageError("bad"), IMPORTER).code == 2


def test_os_errors_internal_errors_and_interrupts() -> None:
    error = FileNotFoundError(2, "No such file or directory", "/a", None, "/b")
    assert failure(error, CLI).message == "No such file or directory: /a -> /b"
    assert failure(error, CLI).hint == "rerun with -v for details"
    assert failure(error, IMPORTER).hint is None
    internal = failure(ValueError("x"), IMPORTER)
    assert (internal.message, internal.code) == ("internal error: ValueError: x", 1)
    for voice in (CLI, IMPORTER):
        interrupted = failure(KeyboardInterrupt(), voice)
        assert (interrupted.message, interrupted.code, interrupted.cause) == (
            "interrupted", 130, None)


def test_pipes() -> None:
    """A closed stdout ends ``ocistage`` quietly; another broken pipe is an error."""
    assert failure(ClosedStdout(), CLI) == Failure("", None, CLOSED_STDOUT, quiet=True)
    child = BrokenPipeError(32, "Broken pipe", "/child")
    assert failure(PipeError(child), CLI).message == "Broken pipe: /child"
    assert failure(BrokenPipeError(32, "Broken pipe"), IMPORTER).message == "Broken pipe"


def test_lines_are_written_without_control_characters() -> None:
    out = io.StringIO()
    write_failure(Failure("gone \x1b[2J", "try \x07again", 1), out)
    assert out.getvalue() == "error: gone \\x1b[2J\nhint: try \\x07again\n"


@pytest.mark.parametrize("argv", [["get", "docker://reg#"], ["frobnicate"]])
def test_the_importer_says_its_errors_without_typer_or_rich(tmp_path: Path,
                                                            argv: list[str]) -> None:
    code = ("import sys\nfrom ocistage.bundler.pyxis.main import run\n"
            f"assert run({argv!r}) == 2\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'rich', "
            "'click')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60,
                          env={**os.environ, "OCISTAGE_CACHE": str(tmp_path / "cache")})
    assert done.stdout == "[]\n" and done.stderr.startswith("error: "), done.stderr
