"""Writing a file atomically (a temp file beside it, fsync, rename) and recognising the temp
files of writers that died (:func:`dead_writer_temp`, swept by the store and cache gc)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

from ocistage.cache.dirfds import DIR_FOLLOW
from ocistage.cache.nodes import host_name

_TEMP_RE = re.compile(r"^\..*\.ocistage@(?P<host>[A-Za-z0-9.-]*)-(?P<pid>\d+)-[^/]*\.tmp$")


def _temp_tag() -> str:
    return "ocistage@" + re.sub(r"[^A-Za-z0-9.-]", "_", host_name())


def dead_writer_temp(name: str) -> bool:
    """Whether ``name`` is a temp file of :func:`write_file_atomic` whose writer ran on this
    host and has exited (a cache shared between nodes keeps other hosts' temp files; a reused
    pid keeps one until that process exits too)."""
    match = _TEMP_RE.match(name)
    if match is None or f"ocistage@{match.group('host')}" != _temp_tag():
        return False
    try:
        os.kill(int(match.group("pid")), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def fsync_dir(path: Path) -> None:
    fd = os.open(path, DIR_FOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_temp(path: Path) -> tuple[int, str]:
    """A new temp file beside ``path``, owner-only, as ``tempfile.mkstemp`` makes one
    (``O_EXCL``, never through a link, another name if one is taken), named for
    :func:`dead_writer_temp`; made here so that a command writing one small file does not
    import tempfile and random."""
    prefix = os.path.join(path.parent, f".{path.name}.{_temp_tag()}-{os.getpid()}-")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = f"{prefix}{os.urandom(6).hex()}.tmp"
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", prefix)


def write_file_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` through a temp file in the same directory, fsync and rename."""
    # the writer's host and pid in the name let clean_leftovers() drop a dead writer's temp
    fd, tmp = _make_temp(path)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)

