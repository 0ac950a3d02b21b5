"""The absolute path, inside a bundle's rootfs, of the command a container is to run.

Slurm 24.05's slurmstepd resolves a command without a ``/`` against the job's ``PATH`` *on the
host* before it hands it to the container runtime (``task.c`` ``_build_path``), so ``srun
--container=B sh`` runs the host's ``/usr/bin/sh``, which an image may well lack (22.05 passed
``sh`` through). :func:`resolve_command` does the lookup the container's own ``execvp`` would do
(``PATH`` from the bundle's ``process.env``), inside the rootfs with chroot semantics
(:func:`ocistage.runtimes.userdb.open_in_rootfs`: no symlink leads out of it), and returns the
command with that absolute path; a command that has a ``/`` or is not found is returned unchanged.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from ocistage.runtimes.userdb import open_in_rootfs

#: what runc and crun search when the config has no PATH
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def resolve_command(bundle: Path, command: Sequence[str]) -> list[str]:
    """``command`` with its first word made absolute by a PATH lookup inside ``bundle``."""
    args = list(command)
    if not args or not args[0] or "/" in args[0]:
        return args
    rootfs, search = _rootfs_and_path(bundle)
    for directory in search.split(":"):
        if not directory.startswith("/"):
            continue  # a relative PATH entry means the process's cwd: not ours to guess
        candidate = f"{directory.rstrip('/')}/{args[0]}"
        if _executable(rootfs, candidate):
            return [candidate, *args[1:]]
    return args


def _rootfs_and_path(bundle: Path) -> tuple[Path, str]:
    try:
        config = json.loads((bundle / "config.json").read_text())
    except (OSError, ValueError):
        return bundle / "rootfs", DEFAULT_PATH
    root = config.get("root", {}).get("path", "rootfs") if isinstance(config, dict) else "rootfs"
    rootfs = bundle / root if isinstance(root, str) else bundle / "rootfs"
    env = config.get("process", {}).get("env", []) if isinstance(config, dict) else []
    for entry in env if isinstance(env, list) else []:
        if isinstance(entry, str) and entry.startswith("PATH="):
            return rootfs, entry[len("PATH="):]
    return rootfs, DEFAULT_PATH


def _executable(rootfs: Path, path: str) -> bool:
    try:
        file = open_in_rootfs(rootfs, path)
    except OSError:
        return False
    if file is None:
        return False
    with file:
        return bool(os.fstat(file.fileno()).st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH))
