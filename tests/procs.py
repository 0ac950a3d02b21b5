"""Processes as /proc shows them, for tests that check what a command leaves running."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def _status(pid: str) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {key: value.strip() for key, _, value in
            (line.partition(":\t") for line in text.splitlines()) if value}


def children(pid: int) -> list[int]:
    """The direct children of ``pid``."""
    return [int(entry) for entry in os.listdir("/proc")
            if entry.isdigit() and _status(entry).get("PPid") == str(pid)]


def descendants_named(pid: int, name: str) -> list[int]:
    """Processes called ``name`` among the descendants of ``pid``."""
    found, queue = [], [pid]
    while queue:
        for child in children(queue.pop()):
            queue.append(child)
            if _status(str(child)).get("Name") == name:
                found.append(child)
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def default_sigint() -> None:
    """``preexec_fn`` of a child a test sends SIGINT, as a terminal's Ctrl-C would reach it: a
    run started in the background of a shell without job control (CI, ``cmd &`` in a script)
    inherits SIGINT ignored, and Python then keeps it so."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
