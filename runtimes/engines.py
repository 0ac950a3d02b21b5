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

from ocistage.errors import UsageError


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


def _check_path(path: str) -> str:
    """``path`` if the snippets carry it as it is: absolute, printable (no control character, no
    non-UTF-8 byte: TOML and JSON hold text), no quote or backslash, and no ``:`` (its
    directory goes into conmon's ``PATH``, where a ``:`` would start another entry)."""
    if not path.startswith("/") or not path.isprintable() or any(c in path for c in "\"'\\:"):
        raise UsageError(f"path must be absolute and plain, not {path!r}",
                         "it is written into the engine's configuration as it is: no quotes, "
                         "backslashes, colons, control characters or non-UTF-8 bytes")
    return path


def docker_daemon_json(scrun: str) -> str:
    """``~/.config/docker/daemon.json`` for rootless Docker with scrun as default runtime."""
    config = {
        "experimental": True,
        "iptables": False,
        "ip-forward": False,   # no bridge to forward for; rootless with --net=host cannot
        "bridge": "none",
        "no-new-privileges": True,
        "rootless": True,
        "selinux-enabled": False,
        # a plain directory per container, which the nodes' hooks can read (overlay2 mounts
        # the rootfs in rootlesskit's mount namespace, which srun on a node cannot see)
        "storage-driver": "vfs",
        "default-runtime": "slurm",
        "runtimes": {"slurm": {"path": _check_path(scrun)}},
    }
    return json.dumps(config, indent=2) + "\n"


#: conmon's PATH when containers.conf sets none (Podman 4's default ``conmon_env_vars``)
CONMON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def conmon_path(scrun: str) -> str:
    """The PATH conmon passes to ``scrun create`` (and so to the anchor, its job and the
    scrun.lua hooks): scrun's directory first (the srun beside it, for a Slurm installed
    under a prefix of its own), then Podman's default.

    Podman passes conmon only ``conmon_env_vars`` and a few variables of its own, and runs
    ``scrun start/state/kill/delete`` with nothing but ``XDG_RUNTIME_DIR`` and its PATH:
    no ``SLURM_CONF`` reaches scrun (docs/slurm.md, "Rootless Podman").
    """
    directory = os.path.dirname(_check_path(scrun))
    if directory in CONMON_PATH.split(":"):
        return CONMON_PATH
    return f"{directory}:{CONMON_PATH}"


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
        f'conmon_env_vars = ["PATH={conmon_path(path)}"]',
        "",
        "[engine.runtimes]",
        f'slurm = ["{path}"]',
        "",
    ])


def docker_run_flags() -> list[str]:
    """What users add to ``docker run`` for scrun (Docker cannot set these in daemon.json)."""
    return ["--security-opt", "label:disable", "--security-opt", "seccomp=unconfined",
            "--security-opt", "apparmor=unconfined", "--net=none"]
