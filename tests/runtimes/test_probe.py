"""runtimes/probe.py: asking a tool on PATH about itself, with bounded memory and time, against
real processes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ocistage.runtimes.probe import probe


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", f"{path}:/usr/bin:/bin")
    return path


def _tool(bin_dir: Path, name: str, body: str) -> str:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return name


def test_output_of_both_streams_and_the_exit_status(bin_dir: Path) -> None:
    result = probe([_tool(bin_dir, "t", r"printf 'v 1.2\377\n'; echo oops >&2; exit 3")])
    assert result is not None
    assert (result.stdout, result.stderr, result.returncode) == ("v 1.2\ufffd\n", "oops\n", 3)
    assert not result.truncated


def test_a_missing_tool_is_none(bin_dir: Path) -> None:
    assert probe(["no-such-tool-here"]) is None


def test_endless_output_is_cut_at_the_limit_and_the_tool_killed(bin_dir: Path) -> None:
    result = probe([_tool(bin_dir, "t", "yes | cat")], limit=1000)
    assert result is not None
    assert result.truncated and result.returncode is None
    assert result.output == "y\n" * 500


def test_a_tool_that_never_ends_is_killed_with_its_children(bin_dir: Path,
                                                            tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    # the grandchild keeps the pipes open after its parent's end: no EOF ever comes
    started = time.monotonic()
    result = probe([_tool(bin_dir, "t", f"echo started; sleep 600 & echo $! > {pid_file}; wait")],
                   timeout=1.0)
    assert time.monotonic() - started < 30
    assert result is not None
    assert result.returncode is None and not result.truncated
    assert result.stdout == "started\n"
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_environment_is_passed(bin_dir: Path) -> None:
    result = probe([_tool(bin_dir, "t", 'echo "$PROBED"')],
                   env={**os.environ, "PROBED": "yes"})
    assert result is not None and result.stdout == "yes\n"
