"""Make a runtime ``config.json`` run under rootless ``runc``/``crun``: one set of rules.

Two kinds of config pass through here: the ones ocistage builds from an image config
(:mod:`ocistage.bundler.runtime_config`) and the ones Docker/Podman hand to ``scrun``, which
``ocistage scrun stage-in`` rewrites before Slurm runs them (:mod:`ocistage.runtimes.scrun_config`).
Whatever made it, a config runs rootless only if:

- it has a user namespace mapping the process user to the caller
  (:mod:`ocistage.runtimes.idmap`: one id each, plus container 0 where runc 1.1 needs it), and
  no supplementary groups (a one-id
  namespace maps one gid, ``setgroups`` to others fails);
- ``proc`` is mounted in a pid namespace of its own (the kernel refuses a ``proc`` mount in a
  user namespace that does not own the pid namespace: Podman's ``pidns = "host"`` config has
  none), ``mqueue`` in an ipc namespace of its own, and a hostname is set only with a uts one;
- ``sysfs`` is not mounted without a network namespace of its own: Slurm runs containers on the
  host network, so the network namespace goes and ``/sys`` becomes a read-only recursive bind
  of the host's; cgroup mounts go with the cgroup namespace (Slurm owns the job's cgroups);
- ``devpts`` has no ``gid=`` option (gid 5, tty, is not mapped);
- no rlimit exceeds the caller's hard limit (an unprivileged process cannot raise it: Podman
  writes ``RLIMIT_NOFILE`` 1048576); such limits are lowered to the caller's hard limit;
- no cgroup path, resources, Intel RDT or ``net.*`` sysctls without a network namespace.

:func:`make_rootless` returns the new config and one line per change it made.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ocistage.runtimes.idmap import RootPlaceholder, mappings

#: namespaces a rootless container on a Slurm node may not have: the host network, the job's
#: cgroup
HOST_NAMESPACES = ("network", "cgroup")
SYSFS_BIND = {"destination": "/sys", "type": "none", "source": "/sys",
              "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]}


@dataclass(frozen=True)
class RootlessIds:
    """Who runs the container outside, and what container 0 maps to if the process is not 0."""

    host_uid: int
    host_gid: int
    placeholder: RootPlaceholder | None = None


def make_rootless(config: Mapping[str, Any], ids: RootlessIds,
                  ) -> tuple[dict[str, Any], list[str]]:
    """``config`` rewritten to run rootless as ``ids`` (see the module docstring); the input is
    not modified. Returns the config and what changed, one description per item."""
    result: dict[str, Any] = json.loads(json.dumps(config))
    changes: list[str] = []
    process = result.setdefault("process", {})
    user = process.setdefault("user", {})
    if user.pop("additionalGids", None) is not None:
        changes.append("process.user.additionalGids")
    _clamp_rlimits(process, changes)
    linux = result.setdefault("linux", {})
    mounts = [mount for mount in result.get("mounts", []) if isinstance(mount, dict)]
    kept = _rootless_namespaces(linux, mounts, changes)
    if "hostname" in result and "uts" not in kept:
        result.pop("hostname")
        changes.append("hostname (no uts namespace)")
    _map_ids(linux, user, ids)
    result["mounts"] = _rootless_mounts(mounts, changes)
    _drop_host_settings(linux, changes)
    return result, changes


def _rootless_namespaces(linux: dict[str, Any], mounts: list[dict[str, Any]],
                         changes: list[str]) -> list[str | None]:
    """``linux.namespaces`` without the host's (:data:`HOST_NAMESPACES`), with a pid or ipc
    namespace where a ``proc`` or ``mqueue`` mount needs one, and a user namespace last;
    returns the kinds kept besides the user namespace."""
    kinds = [ns.get("type") for ns in linux.get("namespaces", []) if isinstance(ns, dict)]
    for kind in HOST_NAMESPACES:
        if kind in kinds:
            changes.append(f"{kind} namespace (Slurm runs containers on the host network, in "
                           "the job's cgroup)")
    kept = [kind for kind in kinds if kind not in (*HOST_NAMESPACES, "user")]
    needs = {"pid": "proc", "ipc": "mqueue"}
    for kind, mount_type in needs.items():
        if kind not in kept and any(m.get("type") == mount_type for m in mounts):
            kept.append(kind)
            changes.append(f"{kind} namespace added (a {mount_type} mount needs its own)")
    linux["namespaces"] = [{"type": kind} for kind in [*kept, "user"]]
    return kept


def _map_ids(linux: dict[str, Any], user: Mapping[str, Any], ids: RootlessIds) -> None:
    """The user namespace's mappings: the process user to ``ids``
    (:mod:`ocistage.runtimes.idmap`)."""
    uid, gid = int(user.get("uid", 0)), int(user.get("gid", 0))
    placeholder = ids.placeholder
    linux["uidMappings"] = mappings(uid, ids.host_uid, placeholder.uid if placeholder else None)
    linux["gidMappings"] = mappings(gid, ids.host_gid, placeholder.gid if placeholder else None)


def _drop_host_settings(linux: dict[str, Any], changes: list[str]) -> None:
    """Without the host's cgroup and network namespaces: no cgroup path, resources, Intel RDT
    or ``net.*`` sysctls."""
    for key in ("cgroupsPath", "resources", "intelRdt"):
        if linux.pop(key, None) is not None:
            changes.append(f"linux.{key}")
    sysctl = linux.get("sysctl")
    if isinstance(sysctl, dict):
        for name in [name for name in sysctl if name.startswith("net.")]:
            sysctl.pop(name)
            changes.append(f"linux.sysctl {name} (no network namespace)")


def _rootless_mounts(mounts: list[dict[str, Any]], changes: list[str]) -> list[dict[str, Any]]:
    result = []
    for mount in mounts:
        kind, destination = mount.get("type"), mount.get("destination")
        if kind in ("cgroup", "cgroup2"):
            changes.append(f"mount {destination} ({kind}: no cgroup namespace)")
            continue
        if kind == "sysfs":
            changes.append(f"mount {destination} (sysfs -> read-only bind of /sys: no network "
                           "namespace)")
            result.append({**SYSFS_BIND, "destination": destination})
            continue
        options = mount.get("options")
        if kind == "devpts" and isinstance(options, list):
            kept = [o for o in options if not (isinstance(o, str) and o.startswith("gid="))]
            if kept != options:
                changes.append(f"mount {destination} option gid= (unmapped group)")
                mount = {**mount, "options": kept}
        result.append(mount)
    return result


def _clamp_rlimits(process: dict[str, Any], changes: list[str]) -> None:
    for limit in process.get("rlimits", []):
        if not isinstance(limit, dict) or not isinstance(limit.get("type"), str):
            continue
        number = getattr(resource, limit["type"], None)
        if not isinstance(number, int):
            continue
        _, hard = resource.getrlimit(number)
        if hard == resource.RLIM_INFINITY or int(limit.get("hard", 0)) <= hard:
            continue
        changes.append(f"process.rlimits {limit['type']} {limit.get('hard')} -> {hard} "
                       "(above the hard limit)")
        limit["hard"] = hard
        limit["soft"] = min(int(limit.get("soft", hard)), hard)
