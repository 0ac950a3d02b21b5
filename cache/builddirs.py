"""Scratch directories beside a destination that a process builds it in (bundles being built):
their names, whether their builder is gone, and removing dead builders' ones.

``.NAME.ocistage-<host>-<pid>-<random>`` beside ``NAME`` (:func:`scratch_name`) is published
as ``NAME`` by one ``rename()``; a killed build leaves it behind, for :func:`remove_dead_scratch`
(the next build of ``NAME``) or cache gc (``CACHE/bundles``).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from ocistage.cache.dirtrust import owned_by_caller
from ocistage.cache.errors import UntrustedPath
from ocistage.cache.nodes import host_name
from ocistage.cache.treeremoval import remove_tree

_SCRATCH_RE = re.compile(
    r"^\.(?P<name>.+)\.ocistage-(?:(?P<host>.+)-)?(?P<pid>\d+)-(?P<rand>[0-9a-f]{8})$")
#: a scratch dir of another host is assumed dead once it has not changed for this long
SCRATCH_STALE_SECONDS = 24 * 3600.0


def scratch_name(name: str) -> str:
    """The name of a scratch directory, beside ``name``, that this process builds ``name`` in."""
    return f".{name}.ocistage-{host_name()}-{os.getpid()}-{os.urandom(4).hex()}"


def scratch_target(path: Path) -> str | None:
    """The name a scratch directory is building, or None if ``path`` is no scratch dir."""
    match = _SCRATCH_RE.match(path.name)
    return match.group("name") if match else None


def scratch_is_dead(path: Path, now: float | None = None) -> bool:
    """Whether the process building scratch dir ``path`` is known to be gone.

    On this host: its pid does not exist. Another host (or an old name without a host): the
    directory has not changed for :data:`SCRATCH_STALE_SECONDS`.
    """
    match = _SCRATCH_RE.match(path.name)
    if match is None:
        return False
    if match.group("host") == host_name():
        try:
            os.kill(int(match.group("pid")), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, OverflowError):
            return False
        return False
    try:
        age = (time.time() if now is None else now) - os.lstat(path).st_mtime
    except FileNotFoundError:
        return False
    return age > SCRATCH_STALE_SECONDS


def remove_dead_scratch(parent: Path, name: str | None = None) -> list[Path]:
    """Remove scratch dirs in ``parent`` (those building ``name``, or all) of dead builders.

    Only scratch dirs the caller owns are candidates: in a directory others can write (a
    sticky ``/tmp``), a name that looks like ours may have been planted by anybody.
    """
    removed: list[Path] = []
    prefix = "." if name is None else f".{name}.ocistage-"
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(parent) as it:
        candidates = [Path(e.path) for e in it if e.name.startswith(prefix)]
    for path in candidates:
        try:
            mine = owned_by_caller(os.lstat(path))
        except FileNotFoundError:
            continue
        if mine and scratch_target(path) is not None and scratch_is_dead(path):
            try:
                remove_tree(path)
            except UntrustedPath:
                continue  # others' entries inside are left, and so is the directory
            removed.append(path)
    return removed
