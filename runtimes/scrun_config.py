"""Reads the config.json an engine handed to scrun and rewrites it for Slurm.

What ``ocistage scrun stage-in`` writes beside the staged rootfs: ``root.path`` is the staged
rootfs, the container user is the job user, the job environment is merged, and what cannot
work on a compute node is dropped (the engine's seccomp profile and hooks, bind mounts of
missing sources); the rootless rules are :func:`ocistage.runtimes.rootless.make_rootless`'s.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ocistage.runtimes.errors import ScrunError
from ocistage.runtimes.idmap import detect_root_placeholder
from ocistage.runtimes.rootless import RootlessIds, make_rootless

MAX_CONFIG_BYTES = 4 << 20
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def read_config(path: Path) -> dict[str, Any]:
    """A bundle's config.json (size-capped; must be a JSON object with root.path)."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ScrunError(f"cannot read {path}: {exc.strerror}") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ScrunError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(data)
    except ValueError as exc:
        raise ScrunError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ScrunError(f"{path} is not a JSON object")
    root = config.get("root")
    if not isinstance(root, dict) or not isinstance(root.get("path"), str) or not root["path"]:
        raise ScrunError(f"{path} has no root.path")
    return config


def source_rootfs(bundle: Path, config: Mapping[str, Any]) -> Path:
    """The engine's rootfs: ``root.path``, relative to the bundle unless absolute."""
    path = Path(config["root"]["path"])
    rootfs = path if path.is_absolute() else bundle / path
    if not rootfs.is_dir():
        raise ScrunError(f"the bundle's rootfs {rootfs} is not a directory")
    return rootfs


def read_job_env(path: Path | None) -> list[str]:
    """The job environment scrun.lua wrote (a JSON list of ``NAME=value``, or an object)."""
    if path is None:
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ScrunError(f"cannot read the job environment {path}: {exc}") from exc
    if isinstance(data, dict):  # cjson encodes an empty Lua table as {}
        return [f"{k}={v}" for k, v in data.items() if isinstance(v, str)]
    if not isinstance(data, list):
        raise ScrunError(f"{path}: the job environment is not a list")
    return [item for item in data if isinstance(item, str) and "=" in item]


def merge_env(container_env: Sequence[str], job_env: Sequence[str]) -> list[str]:
    """The container's variables first; then the job's that the container does not set.

    ``SLURM_*`` variables always come from the job (the step must see its own job).
    """
    merged: dict[str, str] = {}
    for item in container_env:
        name, _, value = item.partition("=")
        merged[name] = value
    for item in job_env:
        name, _, value = item.partition("=")
        if not _ENV_NAME_RE.match(name):
            continue
        if name.startswith("SLURM_") or name not in merged:
            merged[name] = value
    return [f"{name}={value}" for name, value in merged.items()]


def rewrite_config(config: Mapping[str, Any], *, root_path: Path, uid: int, gid: int,
                   job_env: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``config`` adjusted for running under Slurm as ``uid:gid``; returns it and what was
    dropped or changed (one description per item).

    The rootless rules are :func:`ocistage.runtimes.rootless.make_rootless`'s, the same as for the
    bundles ocistage makes; here only what is particular to an engine's config handed to scrun.
    """
    result: dict[str, Any] = json.loads(json.dumps(config))
    dropped: list[str] = []
    result["root"]["path"] = str(root_path)
    process = result.setdefault("process", {})
    user = process.setdefault("user", {})
    if uid != 0:
        _run_as_container_root(user, dropped)
    process["env"] = merge_env([e for e in process.get("env", []) if isinstance(e, str)],
                               job_env)
    _drop_engine_hooks(result, dropped)
    result["mounts"] = _mounts_with_sources(result.get("mounts", []), dropped)
    # root may map container 0 to the overflow id; anyone else runs as container 0 (above)
    placeholder = detect_root_placeholder(uid, gid) if uid == 0 else None
    result, changed = make_rootless(result, RootlessIds(uid, gid, placeholder))
    return result, dropped + changed


def _run_as_container_root(user: dict[str, Any], dropped: list[str]) -> None:
    """An unprivileged job user can map only itself, and runc 1.1 needs container 0 mapped:
    the process runs as container root (which is the job user outside)."""
    if (int(user.get("uid", 0)), int(user.get("gid", 0))) != (0, 0):
        dropped.append(f"process.user {user.get('uid', 0)}:{user.get('gid', 0)} (runs as 0:0, "
                       "the job user outside)")
        user["uid"], user["gid"] = 0, 0


def _drop_engine_hooks(result: dict[str, Any], dropped: list[str]) -> None:
    """The engine's seccomp profile and its prestart and createRuntime hooks (its own
    programs, which do not run on a compute node)."""
    linux = result.setdefault("linux", {})
    if linux.pop("seccomp", None) is not None:
        dropped.append("linux.seccomp")
    hooks = result.get("hooks")
    if isinstance(hooks, dict):
        for key in ("prestart", "createRuntime"):
            if hooks.pop(key, None) is not None:
                dropped.append(f"hooks.{key}")


def _is_bind(mount: Any) -> bool:
    return isinstance(mount, dict) and (mount.get("type") == "bind" or "bind" in
                                        mount.get("options", []) or
                                        "rbind" in mount.get("options", []))


def _mounts_with_sources(mounts: Sequence[Any], dropped: list[str]) -> list[Any]:
    """``mounts`` without the bind mounts whose source does not exist here (the engine's
    ``resolv.conf``, ...)."""
    kept = []
    for mount in mounts:
        source = mount.get("source", "") if isinstance(mount, dict) else ""
        if _is_bind(mount) and isinstance(source, str) and not os.path.exists(source):
            dropped.append(f"mount {mount.get('destination')} (source {source} missing)")
            continue
        kept.append(mount)
    return kept
