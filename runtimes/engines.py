"""Rootless Docker and Podman configuration that makes ``scrun`` their OCI runtime.

With these, ``docker run``/``podman run`` on a login node submit the container as a Slurm job;
``scrun.lua`` (``ocistage runtime scrun-lua``) stages the bundle. The settings follow Slurm's
containers guide: no networking of the engine's own (Slurm runs containers on the host
network), no cgroups, SELinux or AppArmor on the login node (they would not apply on the
compute node anyway).
"""

from __future__ import annotations

import json
import os
import shutil

from ocistage.cache.errors import UsageError


def find_scrun(scrun: str | None = None, path: str | None = None) -> str:
    """``scrun`` as given, else the one on ``path`` (default: ``$PATH``), as an absolute path.

    Sites install Slurm under a prefix of their own (``/opt/slurm/bin``, a module); the engine
    runs its runtime by absolute path, so the snippet names the scrun the user has.
    """
    if scrun is not None:
        return _check_path(scrun)
    found = shutil.which("scrun", path=path)
    if found is None:
        raise UsageError("scrun not found on PATH",
                         "load the Slurm (>= 23.02) environment or pass --scrun PATH")
    return _check_path(os.path.abspath(found))


def _check_path(scrun: str) -> str:
    if not scrun.startswith("/") or any(c in scrun for c in "\"'\\\n"):
        raise UsageError(f"scrun path must be absolute and plain, not {scrun!r}")
    return scrun


def docker_daemon_json(scrun: str) -> str:
    """``~/.config/docker/daemon.json`` for rootless Docker with scrun as default runtime."""
    config = {
        "experimental": True,
        "iptables": False,
        "bridge": "none",
        "no-new-privileges": True,
        "rootless": True,
        "selinux-enabled": False,
        "default-runtime": "slurm",
        "runtimes": {"slurm": {"path": _check_path(scrun)}},
    }
    return json.dumps(config, indent=2) + "\n"


def podman_containers_conf(scrun: str) -> str:
    """``~/.config/containers/containers.conf`` for rootless Podman with scrun."""
    path = _check_path(scrun)
    return "\n".join([
        "# Podman -> scrun -> Slurm (written by `ocistage runtime podman-config`)",
        "[containers]",
        'apparmor_profile = "unconfined"',
        'cgroupns = "host"',
        'cgroups = "enabled"',
        "default_sysctls = []",
        "label = false",
        'netns = "host"',
        "no_hosts = true",
        'pidns = "host"',
        'utsns = "host"',
        'userns = "host"',
        "",
        "[engine]",
        'runtime = "slurm"',
        'runtime_supports_nocgroups = ["slurm"]',
        'runtime_supports_json = ["slurm"]',
        "remote = false",
        "",
        "[engine.runtimes]",
        f'slurm = ["{path}"]',
        "",
    ])


def docker_run_flags() -> list[str]:
    """What users add to ``docker run`` for scrun (Docker cannot set these in daemon.json)."""
    return ["--security-opt", "label:disable", "--security-opt", "seccomp=unconfined",
            "--security-opt", "apparmor=unconfined", "--net=none"]
