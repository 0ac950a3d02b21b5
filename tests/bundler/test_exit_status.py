"""``python -m``'s exit status after an interrupt a command handled (bundler/cli/exitstatus.py).

CPython ends a ``-m`` run by SIGINT when a KeyboardInterrupt ever ended a string evaluation,
caught or not: an importer or CLI interrupted during a lazy import (a dataclass's ``exec``)
exited -SIGINT instead of 130 (tests/e2e/test_pyxis_interrupted.py, one run in five).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

MODULE = '''
import sys
from ocistage.bundler.cli.exitstatus import keep_exit_status

try:
    exec("raise KeyboardInterrupt")  # an interrupt landing in a dataclass's definition
except KeyboardInterrupt:
    pass
if {keep}:
    keep_exit_status()
sys.exit(130)
'''


def _run(tmp_path: Path, keep: bool) -> int:
    (tmp_path / "interrupted_cmd.py").write_text(MODULE.format(keep=keep))
    done = subprocess.run([sys.executable, "-m", "interrupted_cmd"], cwd=tmp_path,
                          capture_output=True, timeout=60, check=False)
    return done.returncode


def test_the_status_given_to_sys_exit_is_kept(tmp_path: Path) -> None:
    assert _run(tmp_path, keep=True) == 130


def test_without_it_this_interpreter_ends_by_sigint(tmp_path: Path) -> None:
    """What the helper is for: if a CPython stops doing this, the helper can go."""
    status = _run(tmp_path, keep=False)
    if status == 130:
        pytest.skip("this CPython keeps the status by itself")
    assert status == -signal.SIGINT


@pytest.mark.parametrize("main", ["ocistage/bundler/cli/app.py",
                                  "ocistage/bundler/pyxis/main.py"])
def test_both_entry_points_keep_it(main: str) -> None:
    source = (Path(__file__).parents[2] / main).read_text()
    assert source.index("keep_exit_status()") < source.rindex("sys.exit(")
