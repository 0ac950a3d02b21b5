"""How a command's process ends (bundler/cli/exitstatus.py): at once with its status, atexit
handlers run and output flushed, or as the interpreter ends where other threads run; and
``python -m``'s exit status after an interrupt a command handled.

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


ENDING = '''
import atexit, sys, threading, time
from pathlib import Path
from ocistage.bundler.cli.exitstatus import end_process

here = Path(sys.argv[1])
atexit.register(lambda: (here / "atexit").write_text("ran"))
if sys.argv[2] == "thread":
    def late() -> None:
        time.sleep(0.3)
        (here / "thread").write_text("done")
    threading.Thread(target=late).start()
if sys.argv[2] == "interrupted":
    try:
        exec("raise KeyboardInterrupt")  # an interrupt landing in a dataclass's definition
    except KeyboardInterrupt:
        pass
sys.stdout.write("no newline, still buffered")
end_process(int(sys.argv[3]))
'''


def _end(tmp_path: Path, how: str, code: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "ending_cmd.py").write_text(ENDING)
    return subprocess.run([sys.executable, "-m", "ending_cmd", str(tmp_path), how, str(code)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_process_ends_at_once_with_its_handlers_run_and_output_flushed(
        tmp_path: Path) -> None:
    done = _end(tmp_path, "alone", 3)
    assert done.returncode == 3 and done.stdout == "no newline, still buffered"
    assert (tmp_path / "atexit").read_text() == "ran" and done.stderr == ""


def test_at_once_the_status_survives_an_interrupted_string_evaluation(tmp_path: Path) -> None:
    assert _end(tmp_path, "interrupted", 130).returncode == 130


def test_with_another_thread_running_the_interpreter_ends_as_usual(tmp_path: Path) -> None:
    """A thread still running (a download that cannot be cut short) is waited for."""
    done = _end(tmp_path, "thread", 4)
    assert done.returncode == 4 and done.stdout == "no newline, still buffered"
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran"


@pytest.mark.parametrize("main", ["ocistage/bundler/cli/app.py",
                                  "ocistage/bundler/pyxis/main.py"])
def test_both_entry_points_end_so(main: str) -> None:
    source = (Path(__file__).parents[2] / main).read_text()
    assert "end_process(" in source and "sys.exit(" not in source
