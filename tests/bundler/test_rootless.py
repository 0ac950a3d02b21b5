"""ocistage.runtimes.rootless: the one set of rules that makes a runtime config run rootless."""

from __future__ import annotations

import json
import resource
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ocistage.runtimes.idmap import RootPlaceholder
from ocistage.runtimes.rootless import SYSFS_BIND, RootlessIds, make_rootless


def podman_shaped() -> dict[str, Any]:
    """What podman 4.3 with `ocistage runtime podman-config` hands its runtime (abridged)."""
    return {
        "ociVersion": "1.0.2-dev",
        "process": {"user": {"uid": 1000, "gid": 1000, "additionalGids": [1000]},
                    "args": ["/bin/sh"], "cwd": "/",
                    "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 2**40, "soft": 2**40},
                                {"type": "RLIMIT_NPROC", "hard": 1, "soft": 1}]},
        "root": {"path": "/storage/rootfs"},
        "hostname": "vm",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup"},
        ],
        "linux": {"namespaces": [{"type": "mount"}, {"type": "network"}, {"type": "cgroup"}],
                  "cgroupsPath": "/libpod_parent/x", "resources": {"pids": {"limit": 9}},
                  "sysctl": {"net.ipv4.ping_group_range": "0 0", "kernel.msgmax": "8192"}},
    }


def test_podman_shaped_config_becomes_runnable_rootless() -> None:
    original = podman_shaped()
    config, changes = make_rootless(original, RootlessIds(0, 0, RootPlaceholder(65534, 65534)))
    assert original == podman_shaped()  # the input is not modified
    assert [ns["type"] for ns in config["linux"]["namespaces"]] == ["mount", "pid", "ipc",
                                                                    "user"]
    assert config["linux"]["uidMappings"] == [{"containerID": 1000, "hostID": 0, "size": 1},
                                              {"containerID": 0, "hostID": 65534, "size": 1}]
    assert "additionalGids" not in config["process"]["user"]
    assert "hostname" not in config  # no uts namespace
    mounts = {m["destination"]: m for m in config["mounts"]}
    assert mounts["/sys"] == SYSFS_BIND
    assert "gid=5" not in mounts["/dev/pts"]["options"]
    assert "/sys/fs/cgroup" not in mounts
    assert "cgroupsPath" not in config["linux"] and "resources" not in config["linux"]
    assert config["linux"]["sysctl"] == {"kernel.msgmax": "8192"}
    nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limits = {limit["type"]: limit for limit in config["process"]["rlimits"]}
    if nofile_hard != resource.RLIM_INFINITY:
        assert limits["RLIMIT_NOFILE"] == {"type": "RLIMIT_NOFILE", "hard": nofile_hard,
                                           "soft": nofile_hard}
    assert limits["RLIMIT_NPROC"] == {"type": "RLIMIT_NPROC", "hard": 1, "soft": 1}  # lower: kept
    assert "pid namespace added (a proc mount needs its own)" in changes
    assert "mount /dev/pts option gid= (unmapped group)" in changes
    assert any(change.startswith("network namespace") for change in changes)


def test_unprivileged_caller_maps_only_itself() -> None:
    config, _ = make_rootless({"process": {"user": {"uid": 0, "gid": 0}}},
                              RootlessIds(1234, 99))
    assert config["linux"]["uidMappings"] == [{"containerID": 0, "hostID": 1234, "size": 1}]
    assert config["linux"]["gidMappings"] == [{"containerID": 0, "hostID": 99, "size": 1}]
    assert config["linux"]["namespaces"] == [{"type": "user"}]


@given(st.lists(st.sampled_from(["pid", "ipc", "uts", "mount", "network", "cgroup", "user"]),
                unique=True),
       st.lists(st.sampled_from(["proc", "sysfs", "devpts", "mqueue", "cgroup2", "tmpfs"])),
       st.integers(0, 2000), st.integers(0, 70000))
def test_make_rootless_is_idempotent_and_leaves_no_host_namespace(
        namespaces: list[str], mount_types: list[str], uid: int, host_uid: int) -> None:
    config = {"process": {"user": {"uid": uid, "gid": uid}},
              "mounts": [{"destination": f"/m{n}", "type": kind, "source": kind,
                          "options": ["gid=5"]} for n, kind in enumerate(mount_types)],
              "linux": {"namespaces": [{"type": kind} for kind in namespaces]}}
    ids = RootlessIds(host_uid, host_uid, RootPlaceholder(65534, 65534))
    once, _ = make_rootless(config, ids)
    twice, changes = make_rootless(once, ids)
    assert json.dumps(twice) == json.dumps(once)
    assert changes == []
    kinds = [ns["type"] for ns in once["linux"]["namespaces"]]
    assert kinds[-1] == "user" and kinds.count("user") == 1
    assert not {"network", "cgroup"} & set(kinds)
    types = {m["type"] for m in once["mounts"]}
    assert not {"sysfs", "cgroup", "cgroup2"} & types
    assert ("proc" not in types) or "pid" in kinds
    assert ("mqueue" not in types) or "ipc" in kinds
