"""Starting the remover (:mod:`ocistage.stagers.remover`) detached: its own session, nice 19,
stdio on ``/dev/null``, no child of the caller, waiting for its work until it is handed over.

:func:`spawn` forks twice: the first child starts the remover and exits at once (the caller
reaps it), so the remover is nobody's child here, is reparented to init (or the nearest
subreaper) and never becomes a zombie of a long-lived caller, which would count as alive. The
remover makes its own session (``setsid``: its session and process group are its pid, so a
session kill reaches it and its forked workers) and its working directory is ``/``. It is
handed its work through a pipe, after the caller has recorded a lease naming the remover: the
remover reads that pipe to its end and does nothing unless a whole message came (a caller
killed before :meth:`Detached.go` leaves the remover nothing to do, and it exits).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass

from ocistage.cache.leases import Holder

#: the argument of ``python -m`` that runs the remover
REMOVER_MODULE = "ocistage.stagers.remover"
NICENESS = 19


@dataclass
class Detached:
    """A remover started by :func:`spawn`, waiting for :meth:`go` on ``go_fd``."""

    pid: int
    holder: Holder
    go_fd: int

    def go(self, message: dict[str, object]) -> bool:
        """Hand the remover its work (one JSON message) and let it run; False if it is gone
        (it could not start Python: then nobody removes what the message names)."""
        data = json.dumps(message).encode()
        try:
            while data:  # a message is small (paths and a lease id): one write
                data = data[os.write(self.go_fd, data):]
        except OSError:  # EPIPE: no reader any more
            return False
        finally:
            self.cancel()
        return True

    def cancel(self) -> None:
        """Close the pipe without a message: the remover exits doing nothing."""
        if self.go_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.go_fd)
            self.go_fd = -1


def spawn() -> Detached | None:
    """Start a remover detached (module docstring); None if it cannot be started or is gone
    before it could be recognised (the caller then removes what it would have)."""
    go_read, go_write = os.pipe()
    pid_read, pid_write = os.pipe()
    try:
        child = os.fork()
    except OSError:
        for fd in (go_read, go_write, pid_read, pid_write):
            os.close(fd)
        return None
    if child == 0:  # pragma: no cover - the child execs or exits
        _first_child(go_read, go_write, pid_read, pid_write)
    os.close(go_read)
    os.close(pid_write)
    try:
        with os.fdopen(pid_read, "rb") as answer:
            text = answer.read(32)
        _, status = os.waitpid(child, 0)
    except BaseException:
        os.close(go_write)
        raise
    pid = int(text) if text.isdigit() and os.waitstatus_to_exitcode(status) == 0 else 0
    holder = Holder.process(pid) if pid > 0 else None
    if holder is None or holder.start is None:  # not started, or already gone
        os.close(go_write)
        return None
    return Detached(pid, holder, go_write)


def _first_child(go_read: int, go_write: int, pid_read: int, pid_write: int) -> None:
    """In the first child: fork the remover, tell the caller its pid, exit."""
    code = 1
    try:
        os.close(go_write)
        os.close(pid_read)
        remover = os.fork()
        if remover == 0:  # pid_write closes with the exec (O_CLOEXEC): the caller's read
            _exec_remover(go_read)  # of it ends once the remover is set up and running
        os.write(pid_write, str(remover).encode())
        code = 0
    finally:
        os._exit(code)


def _exec_remover(go_read: int) -> None:
    """In the remover before it runs: a session of its own, nice, ``/`` and ``/dev/null``."""
    try:
        os.setsid()
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, NICENESS)
        os.chdir("/")  # ``python -m`` puts the working directory first on sys.path
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.set_inheritable(go_read, True)
        os.execv(sys.executable, [sys.executable, "-m", REMOVER_MODULE, str(go_read)])
    finally:
        os._exit(127)
