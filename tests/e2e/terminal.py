"""Run a command with its stderr on a pseudo-terminal, as a user at a shell would."""

from __future__ import annotations

import os
import pty
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_on_terminal(argv: Sequence[str], env: Mapping[str, str], cwd: Path | str,
                    timeout: float = 120) -> tuple[int, bytes]:
    """Run ``argv`` with stderr on a new pty (stdin and stdout /dev/null); return its exit
    status and everything it drew on the terminal."""
    controller, terminal = pty.openpty()
    shown = b""
    try:
        process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=terminal, env=dict(env),
                                   cwd=cwd)
        os.close(terminal)
        terminal = -1
        while True:  # read while it runs: a full terminal buffer would block the child
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the child's side is closed and all was read
                break
            if not chunk:
                break
            shown += chunk
        process.wait(timeout=timeout)
    finally:
        os.close(controller)
        if terminal >= 0:
            os.close(terminal)
    return process.returncode, shown
