"""Helper tools that end with the process that started them, however it ends.

A long-running helper (mksquashfs building an image for minutes) must not outlive the ocistage
process that started it: killed by SIGKILL (the OOM killer, a job's cleanup), that process
cannot stop its child, which then writes a whole image into a scratch directory nobody will
publish. The kernel's tool, ``PR_SET_PDEATHSIG``, fires when the *thread* that forked the
child exits, not the process, and setting it through ``preexec_fn`` is unsafe in a threaded
process. So :func:`spawn` does not start the tool itself:

- this process holds the write end of a pipe, its *lifeline* (made once, close-on-exec, so no
  child inherits it; closed again in a child made by ``fork()``). Nothing is ever written to
  it: the kernel closes it when this process ends, however it ends;
- :func:`spawn` starts a supervisor, this file run by the same Python isolated and without
  ``site`` (it imports nothing of ocistage), given the lifeline's read end. The supervisor is
  single-threaded, so the ``PR_SET_PDEATHSIG`` (SIGKILL) it sets in the tool's process before
  ``exec`` holds for as long as the supervisor lives: killed itself, even by SIGKILL, it takes
  the tool along;
- the supervisor waits for the tool to end, for the lifeline to close (this process is gone),
  or for SIGTERM, SIGHUP or SIGINT; in the last two cases it kills the tool (SIGKILL), reaps
  it and ends. It ends as the tool ended (the same exit status, or the same signal), so
  :class:`subprocess.Popen`'s ``returncode`` reads as if the tool were the child;
- the tool inherits the supervisor's stdin, stdout, stderr, working directory and
  environment, that is what :func:`spawn` was given; a tool that cannot be run exits 127 with
  a line on stderr.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Sequence

PR_SET_PDEATHSIG = 1
#: the signals on which the supervisor kills the tool and ends
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_SEPARATOR = "--"


# -- the process that starts tools ----------------------------------------------------------------

class _Lifeline:
    """The pipe whose write end only this process holds (made at the first :func:`spawn`)."""

    def __init__(self) -> None:
        self.fds: tuple[int, int] | None = None
        self.lock = threading.Lock()

    def read_end(self) -> int:
        with self.lock:
            if self.fds is None:
                self.fds = os.pipe()  # both ends close-on-exec (PEP 446)
            return self.fds[0]

    def forget(self) -> None:
        """In a child made by ``fork()``: the parent's lifeline is not this process's."""
        self.lock = threading.Lock()  # another thread may have held it at the fork
        if self.fds is not None:
            for fd in self.fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.fds = None


_LIFELINE = _Lifeline()
os.register_at_fork(after_in_child=_LIFELINE.forget)


def supervisor_argv(argv: Sequence[str], lifeline: int) -> list[str]:
    """The command line of the supervisor that runs ``argv`` watching fd ``lifeline``."""
    if not argv:
        raise ValueError("no command to run")
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(lifeline), _SEPARATOR,
            *argv]


def spawn(argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """Start ``argv`` as :class:`subprocess.Popen` would (``popen``: its keyword arguments,
    not ``preexec_fn``), under a supervisor that kills it when this process ends, however it
    ends, or when the supervisor is killed (see the module docstring). The returned
    :class:`~subprocess.Popen` is the supervisor's: ``kill()``, ``wait()``, ``returncode``
    and the pipes work as for the tool itself.

    Raises OSError if the supervisor cannot be started; a tool that cannot be run exits 127.
    """
    import subprocess

    if popen.get("preexec_fn") is not None:
        raise ValueError("spawn() takes no preexec_fn: it is unsafe in a threaded process")
    lifeline = _LIFELINE.read_end()
    pass_fds = (*popen.pop("pass_fds", ()), lifeline)
    return subprocess.Popen(supervisor_argv(argv, lifeline), pass_fds=pass_fds, **popen)


# -- the supervisor (``python -I -S childguard.py LIFELINE -- ARGV``) -----------------------------

def _set_death_signal() -> None:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)`` for this process (done where the parent is
    single-threaded); without ctypes, the supervisor alone stops the tool."""
    with contextlib.suppress(ImportError, OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _run_tool(argv: list[str], supervisor: int, close: Sequence[int]) -> None:
    """In the forked child: default signals, the death signal, then ``exec`` the tool."""
    signal.set_wakeup_fd(-1)
    for signum in (*STOP_SIGNALS, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)  # as Popen's restore_signals
    for fd in close:
        os.close(fd)
    _set_death_signal()
    if os.getppid() != supervisor:  # the supervisor died before the death signal was set
        os._exit(128 + signal.SIGKILL)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"cannot run {argv[0]}: {exc.strerror}\n".encode(errors="replace"))
    os._exit(127)


def _end_as(status: int) -> int:
    """End this process as the tool ended (wait status ``status``); returns the exit code
    to use if its signal did not end it."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        with contextlib.suppress(ImportError, ValueError, OSError):
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the tool's crash, not ours
        if signum != signal.SIGKILL:  # whose action cannot be set: it is the default
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
        return 128 + signum
    return os.waitstatus_to_exitcode(status)


def supervise(args: Sequence[str]) -> int:
    """Run ``LIFELINE -- ARGV``: the tool until it ends, the lifeline closes or a stop
    signal comes; returns the exit code (see :func:`_end_as`)."""
    import select

    if len(args) < 3 or args[1] != _SEPARATOR or not args[0].isdigit():
        os.write(2, b"usage: childguard.py LIFELINE_FD -- COMMAND...\n")
        return 2
    lifeline = int(args[0])
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write)
    stopped: list[int] = []
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda number, _frame: stopped.append(number))
    signal.signal(signal.SIGCHLD, lambda _number, _frame: None)  # wakes the poll below
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:
        _run_tool(list(args[2:]), supervisor, (lifeline, wake_read, wake_write))
    poller = select.poll()
    poller.register(lifeline, select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    orphaned = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return _end_as(status)
        if stopped or orphaned:
            os.kill(pid, signal.SIGKILL)
            return _end_as(os.waitpid(pid, 0)[1])
        for fd, _events in poller.poll():
            if fd == lifeline:  # nothing is ever written: an event is its end
                orphaned = True
            else:
                while True:
                    try:
                        if not os.read(wake_read, 512):
                            break
                    except BlockingIOError:
                        break


if __name__ == "__main__":
    sys.exit(supervise(sys.argv[1:]))
