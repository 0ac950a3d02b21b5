"""cache/childguard.py: a tool started by :func:`spawn` ends with the process that started it,
however that ends (SIGKILL included), also when the thread that started it is long gone; with
real processes and real signals, every wait a poll of /proc with a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache import childguard
from tests.procs import running

DEADLINE = 20.0


def wait_until(condition: object, what: str, deadline: float = DEADLINE) -> None:
    assert callable(condition)
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"{what} after {deadline} s")
        time.sleep(0.02)


def read_pid(path: Path) -> int:
    wait_until(lambda: path.exists() and path.read_text().endswith("\n"), f"no pid in {path}")
    return int(path.read_text())


@pytest.fixture
def survivors() -> Iterator[list[int]]:
    """Pids the test started; any still running at the end is killed (and fails the test
    where it asserts it is gone)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def _tool(pidfile: Path) -> list[str]:
    """A tool that writes its pid, then waits (in a sleep of its own) until it is killed."""
    return ["sh", "-c", f'echo $$ > "{pidfile}.new" && mv "{pidfile}.new" "{pidfile}" && '
            "exec sleep 3600"]


PARENT = textwrap.dedent("""\
    import signal, sys, threading
    from ocistage.cache import childguard

    # SIGHUP at its default, as for a process on a terminal: a suite run under nohup would
    # hand it down ignored, and the SIGHUP case would then test nothing
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

    started = []
    # the tool is started by a thread that ends at once: a PR_SET_PDEATHSIG set for it
    # (in preexec_fn) would kill the tool right then
    thread = threading.Thread(target=lambda: started.append(childguard.spawn(sys.argv[1:])))
    thread.start()
    thread.join()
    print(started[0].pid, flush=True)
    sys.stdin.read()   # until this process is killed
""")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_the_tool_ends_with_a_threaded_parent_killed_by(signum: int, tmp_path: Path,
                                                        survivors: list[int]) -> None:
    pidfile = tmp_path / "tool.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, *_tool(pidfile)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    survivors.append(parent.pid)
    assert parent.stdout is not None
    supervisor = int(parent.stdout.readline())
    tool = read_pid(pidfile)
    survivors += [supervisor, tool]
    assert running(tool), "the tool died with the thread that started it"
    parent.send_signal(signum)
    assert parent.wait(timeout=DEADLINE) == -signum
    wait_until(lambda: not running(tool), f"the tool outlived its parent's {signum!r}")
    wait_until(lambda: not running(supervisor), "the supervisor outlived its parent")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP,
                                    signal.SIGINT])
def test_the_tool_ends_with_its_supervisor(signum: int, tmp_path: Path,
                                           survivors: list[int]) -> None:
    pidfile = tmp_path / "tool.pid"
    process = childguard.spawn(_tool(pidfile))
    survivors.append(process.pid)
    tool = read_pid(pidfile)
    survivors.append(tool)
    process.send_signal(signum)
    assert process.wait(timeout=DEADLINE) == -signal.SIGKILL  # it ended as the tool did
    wait_until(lambda: not running(tool), f"the tool outlived its supervisor's {signum!r}")


def test_the_supervisor_ends_as_the_tool_ends(tmp_path: Path) -> None:
    done = childguard.spawn(["sh", "-c", "echo out; echo err >&2; exit 7"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            stdin=subprocess.DEVNULL)
    assert done.communicate(timeout=DEADLINE) == (b"out\n", b"err\n")
    assert done.returncode == 7
    crashed = childguard.spawn(["sh", "-c", "kill -SEGV $$"])
    assert crashed.wait(timeout=DEADLINE) == -signal.SIGSEGV
    missing = childguard.spawn([str(tmp_path / "no-such-tool")], stderr=subprocess.PIPE)
    _, err = missing.communicate(timeout=DEADLINE)
    assert missing.returncode == 127 and b"no-such-tool: No such file or directory" in err
    here = childguard.spawn(["sh", "-c", 'pwd; echo "$GUARDED"; kill -PIPE $$'],
                            stdout=subprocess.PIPE, cwd=tmp_path,
                            env={**os.environ, "GUARDED": "yes"})
    out, _ = here.communicate(timeout=DEADLINE)
    assert out.decode().splitlines() == [str(tmp_path), "yes"]
    assert here.returncode == -signal.SIGPIPE  # SIGPIPE is the default again in the tool


def test_preexec_fn_is_refused() -> None:
    with pytest.raises(ValueError, match="preexec_fn"):
        childguard.spawn(["true"], preexec_fn=lambda: None)
