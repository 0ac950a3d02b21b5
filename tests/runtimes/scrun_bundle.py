"""Docker/Podman-style bundles for the scrun tests: what the engine hands to scrun.

Docker (through containerd) and Podman write a ``config.json`` whose ``root.path`` is an absolute
path to the container's rootfs somewhere in their storage, with a network namespace, a cgroup
path and resources, prestart hooks, bind mounts of engine files (``resolv.conf``, ``hosts``)
and no user namespace of its own (rootless engines already run inside one).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

ENGINE_FILE = "/var/lib/ocistage-test-engine/containers/abc/resolv.conf"


def docker_style_config(base: dict[str, Any], rootfs: Path) -> dict[str, Any]:
    """``base`` (a runnable runtime config) turned into what a rootless engine would write."""
    config: dict[str, Any] = json.loads(json.dumps(base))
    config["root"] = {"path": str(rootfs), "readonly": False}
    linux = config.setdefault("linux", {})
    linux.pop("uidMappings", None)
    linux.pop("gidMappings", None)
    namespaces = [ns for ns in linux.get("namespaces", []) if ns.get("type") != "user"]
    linux["namespaces"] = [*namespaces, {"type": "network"}, {"type": "cgroup"}]
    linux["cgroupsPath"] = "/docker/abc"
    linux["resources"] = {"devices": [{"allow": False, "access": "rwm"}]}
    config["hooks"] = {"prestart": [{"path": "/usr/bin/engine-network-setup"}]}
    config.setdefault("mounts", []).append({
        "destination": "/etc/resolv.conf", "type": "bind", "source": ENGINE_FILE,
        "options": ["rbind", "rprivate"]})
    return config


def make_engine_bundle(directory: Path, rootfs_source: Path,
                       base_config: dict[str, Any]) -> tuple[Path, Path]:
    """An engine bundle dir (``config.json`` only) plus its rootfs elsewhere; returns both."""
    storage = directory / "storage" / "overlay" / "abc" / "merged"
    shutil.copytree(rootfs_source, storage, symlinks=True)
    bundle = directory / "engine-bundle"
    bundle.mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps(docker_style_config(base_config, storage)))
    return bundle, storage


def minimal_runtime_config() -> dict[str, Any]:
    return {
        "ociVersion": "1.0.2",
        "process": {"user": {"uid": 1000, "gid": 1000, "additionalGids": [10]},
                    "args": ["/bin/sh"], "env": ["PATH=/usr/bin:/bin", "IMAGE=yes"],
                    "cwd": "/"},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]},
    }
