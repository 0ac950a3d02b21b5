"""ocistage.bundler.runtime_config: each conversion rule, and real runs under rootless runc and
crun."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ocistage.bundler.image.errors import SchemaError
from ocistage.bundler.image.schema import validate
from ocistage.bundler.runtime_config import (
    CDI_ANNOTATION,
    DEFAULT_PATH,
    DROPPED_LABELS_ANNOTATION,
    NVIDIA_HOOK_DEFAULT_PATH,
    VOLUMES_ANNOTATION,
    ConfigOptions,
    build_runtime_config,
    write_runtime_config,
)
from ocistage.cache.errors import StoreError
from ocistage.errors import UsageError
from ocistage.runtimes.errors import UserResolutionError
from ocistage.runtimes.idmap import RootPlaceholder
from pytest_ocistage.bundles import hybrid_cgroup_prefix
from pytest_ocistage.components import require_binary, require_root

PASSWD = "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n"
GROUP = "root:x:0:\napp:x:1000:\nvideo:x:44:app\n"
APPLETS = ("sh", "id", "pwd", "env", "cat", "touch", "hostname", "echo")
NOBODY = 65534
ROOT_OPTS = ConfigOptions(host_uid=1234, host_gid=5678, root_placeholder=None)


def image(**config: Any) -> dict[str, Any]:
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": []},
    }


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text(PASSWD)
    (root / "etc" / "group").write_text(GROUP)
    return root


def build(rootfs: Path, options: ConfigOptions = ROOT_OPTS, **config: Any) -> dict[str, Any]:
    config.setdefault("Cmd", ["sh"])
    return build_runtime_config(image(**config), rootfs, options)


# --- process.args ----------------------------------------------------------------------------


@pytest.mark.parametrize(("config", "overrides", "expected"), [
    ({"Entrypoint": ["/ep", "-x"], "Cmd": ["a", "b"]}, {}, ["/ep", "-x", "a", "b"]),
    ({"Entrypoint": ["/ep"], "Cmd": None}, {}, ["/ep"]),
    ({"Entrypoint": None, "Cmd": ["/bin/sh"]}, {}, ["/bin/sh"]),
    ({"Entrypoint": ["/ep"], "Cmd": ["a"]}, {"args": ["b", "c"]}, ["/ep", "b", "c"]),
    ({"Entrypoint": ["/ep"], "Cmd": ["a"]}, {"entrypoint": ["/other"]}, ["/other"]),
    ({"Entrypoint": ["/ep"], "Cmd": ["a"]}, {"entrypoint": ["/o"], "args": ["x"]}, ["/o", "x"]),
    ({"Entrypoint": ["/ep"], "Cmd": ["a"]}, {"entrypoint": [""], "args": ["ls"]}, ["ls"]),
    ({"Entrypoint": [""], "Cmd": ["ls"]}, {}, ["ls"]),
])
def test_args_are_entrypoint_plus_cmd_with_docker_overrides(
        rootfs: Path, config: dict[str, Any], overrides: dict[str, Any],
        expected: list[str]) -> None:
    result = build_runtime_config(image(**config), rootfs, replace(ROOT_OPTS, **overrides))
    assert result["process"]["args"] == expected


def test_nothing_to_run_is_a_usage_error(rootfs: Path) -> None:
    with pytest.raises(UsageError, match="no Entrypoint or Cmd"):
        build_runtime_config(image(), rootfs, ROOT_OPTS)


def test_malformed_cmd_is_a_schema_error(rootfs: Path) -> None:
    with pytest.raises(SchemaError, match=r"config\.Cmd"):
        build(rootfs, Cmd="/bin/sh -c true")


def test_string_instead_of_list_override_is_a_usage_error(rootfs: Path) -> None:
    with pytest.raises(UsageError, match="--cmd"):
        build(rootfs, replace(ROOT_OPTS, args="ls -l"))


# --- process.env -----------------------------------------------------------------------------


def test_env_merges_image_env_overrides_and_defaults(rootfs: Path) -> None:
    options = replace(ROOT_OPTS, env=["B=override", "NEW=1", "EMPTY="])
    env = build(rootfs, options, Env=["A=1", "B=image", "C=x=y"])["process"]["env"]
    assert env == ["A=1", "B=override", "C=x=y", "NEW=1", "EMPTY=", f"PATH={DEFAULT_PATH}",
                   "HOME=/root"]


def test_image_path_and_home_are_not_replaced_by_defaults(rootfs: Path) -> None:
    env = build(rootfs, Env=["PATH=/opt/bin", "HOME=/data"])["process"]["env"]
    assert env == ["PATH=/opt/bin", "HOME=/data"]


def test_home_comes_from_the_image_user(rootfs: Path) -> None:
    assert "HOME=/home/app" in build(rootfs, User="app")["process"]["env"]


def test_term_is_set_for_a_terminal_only(rootfs: Path) -> None:
    assert not any(e.startswith("TERM=") for e in build(rootfs)["process"]["env"])
    process = build(rootfs, replace(ROOT_OPTS, terminal=True))["process"]
    assert process["terminal"] is True
    assert "TERM=xterm" in process["env"]


@pytest.mark.parametrize("entry", ["NOVALUE", "=value", "A\x00B=1", "A=\x00"])
def test_bad_env_override_is_a_usage_error(rootfs: Path, entry: str) -> None:
    with pytest.raises(UsageError, match="--env"):
        build(rootfs, replace(ROOT_OPTS, env=[entry]))


def test_bad_image_env_is_a_schema_error(rootfs: Path) -> None:
    with pytest.raises(SchemaError, match="Env entry 'JUSTNAME'"):
        build(rootfs, Env=["JUSTNAME"])


# --- process.cwd and process.user ------------------------------------------------------------


@pytest.mark.parametrize(("working_dir", "cwd"), [
    (None, "/"), ("", "/"), ("/srv/app", "/srv/app"), ("srv", "/srv"), ("/a/../b/", "/b"),
])
def test_cwd_from_working_dir(rootfs: Path, working_dir: str | None, cwd: str) -> None:
    assert build(rootfs, WorkingDir=working_dir)["process"]["cwd"] == cwd


def test_rootless_maps_the_caller_to_the_image_user(rootfs: Path) -> None:
    config = build(rootfs, User="app")
    assert config["process"]["user"] == {"uid": 1000, "gid": 1000}  # no additionalGids rootless
    assert config["linux"]["uidMappings"] == [{"containerID": 1000, "hostID": 1234, "size": 1}]
    assert config["linux"]["gidMappings"] == [{"containerID": 1000, "hostID": 5678, "size": 1}]


def test_container_root_is_mapped_to_the_placeholder_for_runc_1_1(rootfs: Path) -> None:
    options = replace(ROOT_OPTS, root_placeholder=RootPlaceholder(100000, 200000))
    config = build(rootfs, options, User="app")
    assert config["process"]["user"] == {"uid": 1000, "gid": 1000}
    assert config["linux"]["uidMappings"] == [{"containerID": 1000, "hostID": 1234, "size": 1},
                                              {"containerID": 0, "hostID": 100000, "size": 1}]
    assert config["linux"]["gidMappings"] == [{"containerID": 1000, "hostID": 5678, "size": 1},
                                              {"containerID": 0, "hostID": 200000, "size": 1}]
    # a root image needs no placeholder: the caller is container root
    assert build(rootfs, options)["linux"]["uidMappings"] == [
        {"containerID": 0, "hostID": 1234, "size": 1}]


def test_rootless_root_image_maps_the_caller_to_root(rootfs: Path) -> None:
    config = build(rootfs)
    assert config["process"]["user"] == {"uid": 0, "gid": 0}
    assert config["linux"]["uidMappings"] == [{"containerID": 0, "hostID": 1234, "size": 1}]


def test_map_root_runs_a_user_image_as_container_root(rootfs: Path) -> None:
    config = build(rootfs, replace(ROOT_OPTS, map_root=True), User="app")
    assert config["process"]["user"] == {"uid": 0, "gid": 0}
    assert config["linux"]["uidMappings"] == [{"containerID": 0, "hostID": 1234, "size": 1}]
    assert "HOME=/home/app" in config["process"]["env"]


def test_not_rootless_keeps_supplementary_groups_and_has_no_user_namespace(
        rootfs: Path) -> None:
    config = build(rootfs, replace(ROOT_OPTS, rootless=False), User="app")
    assert config["process"]["user"] == {"uid": 1000, "gid": 1000, "additionalGids": [44]}
    assert "uidMappings" not in config["linux"]
    assert "gidMappings" not in config["linux"]
    assert {"type": "user"} not in config["linux"]["namespaces"]


def test_unknown_image_user_is_an_error(rootfs: Path) -> None:
    with pytest.raises(UserResolutionError, match="ghost"):
        build(rootfs, User="ghost")


def test_capabilities_are_runc_defaults_and_not_effective_for_non_root(rootfs: Path) -> None:
    root_caps = build(rootfs)["process"]["capabilities"]
    defaults = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    assert root_caps == {"bounding": defaults, "effective": defaults, "permitted": defaults}
    user_caps = build(rootfs, User="app")["process"]["capabilities"]
    assert user_caps == {"bounding": defaults, "effective": [], "permitted": []}


def test_process_hardening(rootfs: Path) -> None:
    process = build(rootfs)["process"]
    assert process["noNewPrivileges"] is True
    assert process["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]


# --- linux, root, hostname -------------------------------------------------------------------


@pytest.mark.parametrize("rootless", [True, False])
def test_no_network_namespace_no_cgroup_settings(rootfs: Path, rootless: bool) -> None:
    linux = build(rootfs, replace(ROOT_OPTS, rootless=rootless))["linux"]
    kinds = [ns["type"] for ns in linux["namespaces"]]
    assert "network" not in kinds and "cgroup" not in kinds
    assert {"pid", "ipc", "uts", "mount"} <= set(kinds)
    assert ("user" in kinds) is rootless
    assert "resources" not in linux and "cgroupsPath" not in linux
    assert "/proc/kcore" in linux["maskedPaths"]
    assert "/proc/sys" in linux["readonlyPaths"]


def test_root_and_readonly(rootfs: Path) -> None:
    assert build(rootfs)["root"] == {"path": "rootfs", "readonly": False}
    assert build(rootfs, replace(ROOT_OPTS, readonly=True))["root"]["readonly"] is True


def test_hostname(rootfs: Path) -> None:
    assert "hostname" not in build(rootfs)
    assert build(rootfs, replace(ROOT_OPTS, hostname="node-1.cluster"))["hostname"] == \
        "node-1.cluster"
    for bad in ("", "-x", "a b", "x" * 65, "a/b"):
        with pytest.raises(UsageError, match="hostname"):
            build(rootfs, replace(ROOT_OPTS, hostname=bad))


# --- mounts ----------------------------------------------------------------------------------


def test_base_mounts_rootless_and_not(rootfs: Path) -> None:
    mounts = {m["destination"]: m for m in build(rootfs)["mounts"]}
    assert list(mounts) == ["/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys"]
    assert not any(o.startswith("gid=") for o in mounts["/dev/pts"]["options"])
    assert mounts["/sys"]["source"] == "/sys" and "rbind" in mounts["/sys"]["options"]
    assert "ro" in mounts["/sys"]["options"]
    privileged = {m["destination"]: m for m in build(rootfs, replace(ROOT_OPTS, rootless=False))
                  ["mounts"]}
    assert "gid=5" in privileged["/dev/pts"]["options"]


@pytest.mark.parametrize(("spec", "expected"), [
    ("/host/data:/data", {"destination": "/data", "type": "bind", "source": "/host/data",
                          "options": ["rbind", "rprivate", "rw"]}),
    ("/host/data:/data/:ro", {"destination": "/data", "type": "bind", "source": "/host/data",
                              "options": ["rbind", "rprivate", "ro"]}),
    ("/h:/d:rw", {"destination": "/d", "type": "bind", "source": "/h",
                  "options": ["rbind", "rprivate", "rw"]}),
])
def test_bind_mounts(rootfs: Path, spec: str, expected: dict[str, Any]) -> None:
    assert build(rootfs, replace(ROOT_OPTS, mounts=[spec]))["mounts"][-1] == expected


def test_relative_mount_source_is_made_absolute(rootfs: Path) -> None:
    mount = build(rootfs, replace(ROOT_OPTS, mounts=["data:/data"]))["mounts"][-1]
    assert mount["source"] == os.path.join(os.getcwd(), "data")


@pytest.mark.parametrize("spec", [
    "/only-one", "/a:relative", "/a:/b:rx", "/a:/b:ro:extra", ":/b", "/a:", "/a:/b/../../etc",
    "/a:/", "/a://",
])
def test_bad_mounts_are_usage_errors(rootfs: Path, spec: str) -> None:
    with pytest.raises(UsageError, match="--mount"):
        build(rootfs, replace(ROOT_OPTS, mounts=[spec]))


# --- GPUs ------------------------------------------------------------------------------------


def test_gpus_all_adds_hook_env_and_cdi_annotation(rootfs: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    config = build(rootfs, replace(ROOT_OPTS, gpus="all"))
    assert config["hooks"] == {"prestart": [{"path": NVIDIA_HOOK_DEFAULT_PATH,
                                             "args": ["nvidia-container-runtime-hook",
                                                      "prestart"]}]}
    assert "NVIDIA_VISIBLE_DEVICES=all" in config["process"]["env"]
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in config["process"]["env"]
    assert config["annotations"][CDI_ANNOTATION] == "nvidia.com/gpu=all"


def test_gpu_list_and_hook_found_on_path(rootfs: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    hook = bindir / "nvidia-container-runtime-hook"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    config = build(rootfs, replace(ROOT_OPTS, gpus="0,1"),
                   Env=["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"])
    assert config["hooks"]["prestart"][0]["path"] == str(hook)
    assert "NVIDIA_VISIBLE_DEVICES=0,1" in config["process"]["env"]  # the caller's choice wins
    assert "NVIDIA_DRIVER_CAPABILITIES=all" in config["process"]["env"]  # the image's is kept
    assert config["annotations"][CDI_ANNOTATION] == "nvidia.com/gpu=0,nvidia.com/gpu=1"


@pytest.mark.parametrize("gpus", ["0", "0,1", "0:1", "GPU-6a1c0d0e-3f1b-4c0a-9d5e-1b2c3d4e5f60",
                                  "MIG-GPU-6a1c0d0e-3f1b/1/0", "MIG-6a1c0d0e-3f1b-4c0a"])
def test_gpu_indices_mig_devices_and_uuids_are_taken(rootfs: Path, gpus: str) -> None:
    config = build(rootfs, replace(ROOT_OPTS, gpus=gpus))
    assert f"NVIDIA_VISIBLE_DEVICES={gpus}" in config["process"]["env"]


def test_a_missing_gpu_hook_is_a_warning(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from ocistage.bundler import runtime_config

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(runtime_config, "NVIDIA_HOOK_DEFAULT_PATH", str(tmp_path / "hook"))
    assert runtime_config.gpu_hook_missing(None) is None
    warning = runtime_config.gpu_hook_missing("all")
    assert warning is not None and str(tmp_path / "hook") in warning
    (tmp_path / "hook").touch()
    assert runtime_config.gpu_hook_missing("all") is None


def test_an_empty_entrypoint_says_it_cleared_the_command(rootfs: Path) -> None:
    with pytest.raises(UsageError, match=r"^--entrypoint '' clears the image's Entrypoint and "
                                         r"Cmd, so there is nothing to run$"):
        build(rootfs, replace(ROOT_OPTS, entrypoint=[""]), Entrypoint=["/ep"], Cmd=["a"])


def test_no_gpus_no_hooks(rootfs: Path) -> None:
    config = build(rootfs)
    assert "hooks" not in config
    assert CDI_ANNOTATION not in config["annotations"]


@pytest.mark.parametrize("gpus", ["", "0,", "all,0", "0;rm -rf /", "a b", "banana", "GPU",
                                  "all,all", "-1"])
def test_bad_gpus_are_usage_errors(rootfs: Path, gpus: str) -> None:
    with pytest.raises(UsageError, match="--gpus"):
        build(rootfs, replace(ROOT_OPTS, gpus=gpus))


# --- annotations -----------------------------------------------------------------------------


def test_implicit_annotations_and_label_precedence(rootfs: Path) -> None:
    document = image(Cmd=["sh"], StopSignal="SIGINT",
                     ExposedPorts={"80/tcp": {}, "53/udp": {}},
                     Labels={"org.opencontainers.image.architecture": "from-label",
                             "com.example.team": "hpc", "maintainer": "hpc team",
                             "org.label-schema.version": "1.0"})
    document.update({"variant": "v8", "os.version": "10.0", "os.features": ["win32k"],
                     "author": "me", "created": "2024-01-01T00:00:00Z"})
    annotations = build_runtime_config(document, rootfs, ROOT_OPTS)["annotations"]
    assert annotations == {
        "org.opencontainers.image.os": "linux",
        "org.opencontainers.image.architecture": "from-label",
        "org.opencontainers.image.variant": "v8",
        "org.opencontainers.image.os.version": "10.0",
        "org.opencontainers.image.os.features": "win32k",
        "org.opencontainers.image.author": "me",
        "org.opencontainers.image.created": "2024-01-01T00:00:00Z",
        "org.opencontainers.image.stopSignal": "SIGINT",
        "org.opencontainers.image.exposedPorts": "80/tcp,53/udp",
        "maintainer": "hpc team",
        "org.label-schema.version": "1.0",
        "io.ocistage.dropped-labels": "com.example.team",
    }


def test_only_allowed_labels_become_annotations(rootfs: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """An allow-list (issue 27.12): keys runtimes act on, known today or not, stay out."""
    labels = {"run.oci.handler": "krun", "cdi.k8s.io/x": "vendor.com/dev=all",
              "io.ocistage.image.volumes": "/spoof", "module.wasm.image/variant": "compat",
              "org.criu.config": "/x", "io.katacontainers.config.hypervisor.path": "/x",
              "com.future-runtime.handler": "x", "ok.label": "1", "version": "2",
              "org.opencontainers.image.title": "t"}
    annotations = build(rootfs, Labels=labels)["annotations"]
    assert annotations["version"] == "2"
    assert annotations["org.opencontainers.image.title"] == "t"
    for key in ("run.oci.handler", "cdi.k8s.io/x", "module.wasm.image/variant",
                "org.criu.config", "io.katacontainers.config.hypervisor.path",
                "com.future-runtime.handler", "ok.label"):
        assert key not in annotations
    assert VOLUMES_ANNOTATION not in annotations
    assert annotations[DROPPED_LABELS_ANNOTATION] == (
        "run.oci.handler,cdi.k8s.io/x,io.ocistage.image.volumes,module.wasm.image/variant,"
        "org.criu.config,io.katacontainers.config.hypervisor.path,com.future-runtime.handler,"
        "ok.label")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "run.oci.handler" in warned[0]
    assert "ok.label" not in warned[0] and "com.future-runtime.handler" not in warned[0]


def test_volumes_are_noted_not_mounted(rootfs: Path) -> None:
    config = build(rootfs, Volumes={"/var/lib/data": {}, "/cache": {}})
    assert config["annotations"][VOLUMES_ANNOTATION] == "/var/lib/data,/cache"
    assert not any(m["destination"] in ("/var/lib/data", "/cache") for m in config["mounts"])


def test_label_with_non_string_value_is_a_schema_error(rootfs: Path) -> None:
    with pytest.raises(SchemaError, match="label"):
        build(rootfs, Labels={"a": 1})


# --- validation, comparison with runc spec, writing ------------------------------------------


@pytest.mark.parametrize("options", [
    ROOT_OPTS,
    replace(ROOT_OPTS, rootless=False, readonly=True, hostname="h", gpus="all",
            mounts=["/a:/b:ro"], env=["X=1"], terminal=True),
])
def test_output_validates_against_runtime_schema(rootfs: Path, options: ConfigOptions) -> None:
    validate(build(rootfs, options, User="app"), "runtime-config")


def test_differences_from_runc_spec_rootless_are_the_documented_ones(
        rootfs: Path, tmp_path: Path) -> None:
    runc_spec = json.loads(run_spec("runc", tmp_path))
    ours = build(rootfs)
    theirs_mounts = [m for m in runc_spec["mounts"] if m["destination"] != "/sys/fs/cgroup"]
    assert ours["mounts"] == theirs_mounts
    assert set(runc_spec["linux"]["maskedPaths"]) <= set(ours["linux"]["maskedPaths"])
    assert ours["linux"]["readonlyPaths"] == runc_spec["linux"]["readonlyPaths"]
    assert sorted(map(str, ours["linux"]["namespaces"])) == \
        sorted(map(str, runc_spec["linux"]["namespaces"]))
    caps = runc_spec["process"]["capabilities"]
    assert ours["process"]["capabilities"]["bounding"] == caps["bounding"]
    assert ours["process"]["rlimits"] == runc_spec["process"]["rlimits"]


def test_differences_from_crun_spec_rootless_are_the_documented_ones(
        rootfs: Path, tmp_path: Path) -> None:
    crun_spec = json.loads(run_spec("crun", tmp_path))
    ours = build(rootfs)
    skip = {"/sys", "/sys/fs/cgroup"}  # sysfs needs an owned netns; cgroups belong to Slurm
    assert [m for m in ours["mounts"] if m["destination"] not in skip] == \
        [m for m in crun_spec["mounts"] if m["destination"] not in skip]
    crun_namespaces = {ns["type"] for ns in crun_spec["linux"]["namespaces"]}
    assert {ns["type"] for ns in ours["linux"]["namespaces"]} == crun_namespaces - {"network"}
    assert "resources" in crun_spec["linux"] and "resources" not in ours["linux"]
    assert set(crun_spec["linux"]["maskedPaths"]) <= set(ours["linux"]["maskedPaths"])
    assert ours["linux"]["readonlyPaths"] == crun_spec["linux"]["readonlyPaths"]


def test_write_runtime_config_publishes_atomically(rootfs: Path, tmp_path: Path) -> None:
    bundle = rootfs.parent
    config = build(rootfs)
    (bundle / "config.json").write_text("old")
    path = write_runtime_config(bundle, config)
    assert path == bundle / "config.json"
    assert json.loads(path.read_text()) == config
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in bundle.iterdir()) == ["config.json", "rootfs"]


def test_write_runtime_config_refuses_invalid_config(rootfs: Path) -> None:
    config = build(rootfs)
    config["process"]["args"] = []
    with pytest.raises(SchemaError, match=r"\$\.process\.args"):
        write_runtime_config(rootfs.parent, config)
    assert not (rootfs.parent / "config.json").exists()


def test_write_runtime_config_missing_bundle_is_a_store_error(rootfs: Path,
                                                              tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"config\.json"):
        write_runtime_config(tmp_path / "missing", build(rootfs))


# --- real runs under runc and crun -----------------------------------------------------------


def run_spec(tool: str, where: Path) -> str:
    workdir = where / f"{tool}-spec"
    workdir.mkdir()
    subprocess.run([require_binary(tool), "spec", "--rootless"], cwd=workdir, check=True,
                   timeout=30)
    return (workdir / "config.json").read_text()


def busybox_rootfs(dest: Path) -> Path:
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        require_binary("busybox")
    for sub in ("bin", "etc", "work", "home/app"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, dest / "bin" / "busybox")
    for applet in APPLETS:
        (dest / "bin" / applet).symlink_to("busybox")
    (dest / "etc" / "passwd").write_text(PASSWD)
    (dest / "etc" / "group").write_text(GROUP)
    return dest


def runtime_command(runtime: str, bundle: Path, state: Path, name: str, rootless: bool,
                    as_nobody: bool) -> list[str]:
    command = [require_binary(runtime), f"--rootless={'true' if rootless else 'false'}",
               "--root", str(state), "run", "-b", str(bundle), name]
    if as_nobody:
        command = [require_binary("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}",
                   "--clear-groups", "env", f"XDG_RUNTIME_DIR={state}", f"HOME={state}",
                   *command]
    # crun on a hybrid cgroup host: the test-host workaround of the plugin's run_bundle
    return [*hybrid_cgroup_prefix(runtime), *command]


class Bundles:
    """Makes bundles from a busybox rootfs in a directory every test user can traverse."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0
        self.hostdir = base / "hostdir"
        self.hostdir.mkdir()
        (self.hostdir / "f").write_text("hello from the host\n")

    def make(self, options: ConfigOptions, **config: Any) -> tuple[Path, dict[str, Any]]:
        self.count += 1
        bundle = self.base / f"bundle{self.count}"
        rootfs = busybox_rootfs(bundle / "rootfs")
        document = build_runtime_config(image(**config), rootfs, options)
        write_runtime_config(bundle, document)
        return bundle, document

    def run(self, runtime: str, bundle: Path, *, rootless: bool = True,
            as_nobody: bool = False) -> subprocess.CompletedProcess[str]:
        state = self.base / f"state-{runtime}-{bundle.name}"
        state.mkdir(mode=0o700)
        if as_nobody:
            for path in (self.base, *self.base.rglob("*")):
                os.lchown(path, NOBODY, NOBODY)
        command = runtime_command(runtime, bundle, state, f"ocistage-test-{os.getpid()}-"
                                  f"{bundle.name}", rootless, as_nobody)
        return subprocess.run(command, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)


@pytest.fixture
def bundles() -> Iterator[Bundles]:
    base = Path(tempfile.mkdtemp(prefix="ocistage-rt-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield Bundles(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def caller(**changes: Any) -> ConfigOptions:
    return replace(ConfigOptions(), **changes)


REPORT = "id -u; id -g; pwd; env"


def lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.e2e
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_root_image_runs_rootless(bundles: Bundles, runtime: str) -> None:
    bundle, _ = bundles.make(caller(env=["EXTRA=yes", "FOO=overridden"]),
                             Entrypoint=["/bin/sh", "-c"], Cmd=[REPORT + "; touch /made"],
                             Env=["FOO=bar", "KEEP=1"], WorkingDir="/work")
    out = lines(bundles.run(runtime, bundle))
    assert out[:3] == ["0", "0", "/work"]
    assert {"FOO=overridden", "KEEP=1", "EXTRA=yes", "HOME=/root"} <= set(out[3:])
    assert (bundle / "rootfs" / "made").exists()


@pytest.mark.e2e
def test_user_image_runs_as_the_image_user_under_crun(bundles: Bundles) -> None:
    bundle, _ = bundles.make(caller(args=["sh", "-c", REPORT]), User="app", WorkingDir="/work")
    out = lines(bundles.run("crun", bundle))
    assert out[:3] == ["1000", "1000", "/work"]
    assert "HOME=/home/app" in out


@pytest.mark.e2e
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_user_image_with_map_root(bundles: Bundles, runtime: str) -> None:
    bundle, _ = bundles.make(caller(args=["sh", "-c", REPORT], map_root=True), User="app")
    assert lines(bundles.run(runtime, bundle))[:2] == ["0", "0"]


@pytest.mark.e2e
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_readonly_rootfs_refuses_writes_and_binds_are_visible(bundles: Bundles,
                                                              runtime: str) -> None:
    options = caller(readonly=True, hostname="ocistage-test",
                     mounts=[f"{bundles.hostdir}:/data:ro", f"{bundles.hostdir}:/rw"],
                     args=["sh", "-c", "cat /data/f; hostname; touch /rw/new; touch /data/x; "
                                       "touch /x && echo rootfs-writable || echo rootfs-ro"])
    bundle, _ = bundles.make(options)
    result = bundles.run(runtime, bundle)
    assert result.stdout.splitlines() == ["hello from the host", "ocistage-test", "rootfs-ro"]
    assert "Read-only file system" in result.stderr
    assert (bundles.hostdir / "new").exists()
    assert not (bundles.hostdir / "x").exists()
    assert not (bundle / "rootfs" / "x").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_not_rootless_runs_without_user_namespace(bundles: Bundles, runtime: str) -> None:
    require_root()  # --no-rootless bundles need a privileged runtime
    bundle, _ = bundles.make(caller(rootless=False, args=["sh", "-c", REPORT]), User="app")
    out = lines(bundles.run(runtime, bundle, rootless=False))
    assert out[:2] == ["1000", "1000"]


def _nobody_options(args: Sequence[str], **changes: Any) -> ConfigOptions:
    return caller(host_uid=NOBODY, host_gid=NOBODY, args=list(args), **changes)


@pytest.mark.e2e
def test_unprivileged_caller_crun_image_user(bundles: Bundles) -> None:
    require_root()  # needs root to switch to an unprivileged user (we are already one)
    require_binary("setpriv")
    bundle, _ = bundles.make(_nobody_options(["sh", "-c", "id -u; cat /proc/self/uid_map"]),
                             User="app")
    out = lines(bundles.run("crun", bundle, as_nobody=True))
    assert out[0] == "1000"
    assert out[1].split() == ["1000", str(NOBODY), "1"]


@pytest.mark.e2e
def test_unprivileged_caller_runc_map_root(bundles: Bundles) -> None:
    require_root()  # needs root to switch to an unprivileged user (we are already one)
    require_binary("setpriv")
    bundle, _ = bundles.make(_nobody_options(["sh", "-c", "id -u; cat /proc/self/uid_map"],
                                             map_root=True, readonly=True), User="app")
    out = lines(bundles.run("runc", bundle, as_nobody=True))
    assert out[0] == "0"
    assert out[1].split() == ["0", str(NOBODY), "1"]
