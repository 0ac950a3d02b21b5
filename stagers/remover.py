"""The detached remover: ``python -m ocistage.stagers.remover FD`` removes the retired version
handed to it on descriptor ``FD``, at the lowest CPU and I/O priority.

Started by :func:`ocistage.stagers.detach.spawn` (its own session, nice 19, stdio on
``/dev/null``); it asks for the idle I/O class itself where the kernel has one. It reads one
JSON message to the end of ``FD``: ``{"cache": CACHE, "path": RETIRED, "lease": ID}`` — the
retired version (:data:`ocistage.cache.targetlayout.RETIRED_PREFIX`) and this process's lease
on it — and removes it with
:func:`ocistage.stagers.retired.remove_retired`, its subtrees in a forked worker per usable
CPU. No message (the stager was killed first), or one that does not parse: nothing is done.
Nothing is printed: whatever stops it, the next command finishes the version
(:mod:`ocistage.stagers.retired`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache.cpus import usable_cpus
from ocistage.cache.targetlayout import RETIRED_PREFIX
from ocistage.stagers.retired import REMOVER_LEASE, remove_retired

#: a message is a few hundred bytes
MAX_MESSAGE = 1 << 16
#: ``ioprio_set(2)`` by machine (no libc wrapper), ``IOPRIO_WHO_PROCESS``, the idle class
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "ppc64le": 273, "ppc64": 273, "riscv64": 30,
               "s390x": 282}
_IOPRIO_WHO_PROCESS = 1
_IOPRIO_IDLE = 3 << 13
_LEASE = re.compile(re.escape(REMOVER_LEASE) + r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Message:
    """The remover's work: the retired version ``path`` and its lease ``lease`` in
    ``cache``."""

    cache: Path
    path: Path
    lease: str


def idle_io() -> bool:
    """Put this process in the idle I/O class; False where that cannot be done."""
    number = _IOPRIO_SET.get(platform.machine())
    if number is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.syscall(number, _IOPRIO_WHO_PROCESS, 0, _IOPRIO_IDLE) == 0)
    except (OSError, AttributeError):
        return False


def read_message(fd: int) -> Message | None:
    """The message on ``fd`` (read to its end), if it is a whole one naming a retired
    version (an absolute path), a cache and a remover's lease."""
    data = b""
    with contextlib.suppress(OSError):
        while len(data) <= MAX_MESSAGE and (chunk := os.read(fd, MAX_MESSAGE)):
            data += chunk
    try:
        message = json.loads(data)
    except ValueError:
        return None
    if not isinstance(message, dict):
        return None
    fields = [message.get(key) for key in ("cache", "path", "lease")]
    if not all(isinstance(value, str) for value in fields):
        return None
    cache, path, lease = (str(value) for value in fields)
    if not (os.path.isabs(path) and os.path.normpath(path) == path
            and os.path.basename(path).startswith(RETIRED_PREFIX) and _LEASE.fullmatch(lease)):
        return None
    return Message(Path(cache), Path(path), lease)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        return 2
    idle_io()
    message = read_message(int(argv[0]))
    if message is None:
        return 0
    try:
        remove_retired(message.path, message.cache, message.lease, usable_cpus())
    except Exception:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
