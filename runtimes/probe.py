"""Asking a tool about itself (``runc --version``, ``mksquashfs -help``, ``scontrol
--version``) without trusting what it prints.

A probed tool is whatever is first on ``PATH``: it may print bytes that are not UTF-8, print
without end, or never exit. :func:`probe` keeps at most ``limit`` bytes of its output (stdout
and stderr together), kills it (its whole process group: a wrapper script's children too) once
it prints more or outlives ``timeout``, and decodes what it kept with replacement characters.
Memory stays bounded by ``limit`` whatever the tool does.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: what a version or help text can reasonably take
PROBE_LIMIT = 64 << 10
#: how long one probed command may take
PROBE_TIMEOUT = 20.0
_CHUNK = 16 << 10


@dataclass(frozen=True)
class Probed:
    """What a probed command printed (decoded, at most the limit in all), how it ended:
    ``returncode`` None when it was killed (``truncated``: it printed more than the limit;
    else it outlived the timeout)."""

    stdout: str
    stderr: str
    returncode: int | None
    truncated: bool = False

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def probe(argv: Sequence[str], *, limit: int = PROBE_LIMIT, timeout: float = PROBE_TIMEOUT,
          env: Mapping[str, str] | None = None) -> Probed | None:
    """Run ``argv`` (``argv[0]`` looked up on PATH) with no stdin; None when it is not there
    or cannot be started."""
    binary = shutil.which(argv[0])
    if binary is None:
        return None
    try:
        process = subprocess.Popen(
            [binary, *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
            env=dict(env) if env is not None else None)
    except (OSError, subprocess.SubprocessError):
        return None
    with process:
        assert process.stdout is not None and process.stderr is not None
        streams = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
        deadline = time.monotonic() + timeout
        overflow = _read_bounded(streams, limit, deadline)
        left = deadline - time.monotonic()
        if overflow or left <= 0:
            _kill_group(process)
        else:
            try:
                process.wait(timeout=left)
            except subprocess.TimeoutExpired:
                _kill_group(process)
        killed = overflow or process.returncode is None
        process.wait()
    out, err = (bytes(data).decode("utf-8", errors="replace") for data in streams.values())
    return Probed(out, err, None if killed else process.returncode, truncated=overflow)


def _read_bounded(streams: dict[int, bytearray], limit: int, deadline: float) -> bool:
    """Read the pipes into their buffers until both end or the deadline passes; True (and
    stop) as soon as they hold more than ``limit`` bytes together (the excess is dropped)."""
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                kept = sum(len(data) for data in streams.values())
                streams[key.fd] += chunk[:max(limit - kept, 0)]
                if kept + len(chunk) > limit:
                    return True
    return False


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the probe's process group (it is its leader, not yet reaped)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
