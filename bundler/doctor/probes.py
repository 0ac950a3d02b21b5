"""The probes that gather what the doctor's checks judge.

A small file's text, a command's output, free space, the nearest existing directory, a user's
name; each gives None (or a fallback) where the host does not answer."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

#: how long one probed command may take
PROBE_TIMEOUT = 20.0


def read_text(path: Path, limit: int = 1 << 20) -> str | None:
    """The text of a small file (``/proc/sys``, ``/etc/subuid``), None if it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return None


def command_output(argv: list[str]) -> str | None:
    """stdout and stderr of ``argv`` (looked up on PATH), None if it is not there or cannot be
    run; the exit status is not judged here. Bounded (:func:`ocistage.runtimes.probe.probe`):
    at most 64 KiB, decoded with replacement characters, the tool killed after 20 s."""
    from ocistage.runtimes.probe import probe

    result = probe(argv, timeout=PROBE_TIMEOUT)
    return None if result is None else result.output


def free_space(path: Path) -> int | None:
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def existing_ancestor(path: Path) -> Path:
    """``path`` or the nearest directory above it that exists."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
