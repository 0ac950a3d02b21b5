"""Image config -> OCI runtime ``config.json`` (rootless by default).

Follows image-spec ``conversion.md``: ``process.args`` = Entrypoint + Cmd, ``process.env`` from
``Env``, ``process.cwd`` from ``WorkingDir``, ``process.user`` from ``User`` resolved against the
rootfs (:mod:`ocistage.runtimes.userdb`), annotations from the implicit fields and ``Labels``. The
rest is ocistage's own policy, chosen to run under rootless ``runc``/``crun`` and under Slurm:

- rootless (default): a user namespace mapping the caller's host uid/gid to the image user's
  uid/gid (one id each, no ``newuidmap`` needed), plus mount, pid, ipc and uts namespaces;
- never a network namespace (host network, as Slurm requires), no ``linux.resources``, no
  ``cgroupsPath`` (Slurm owns the job's cgroups), no ``/sys/fs/cgroup`` mount;
- mounts, masked and read-only paths, capabilities, rlimits and ``noNewPrivileges`` as
  ``runc spec --rootless`` writes them, with the differences listed in docs/runtime-config.md.

The result always validates against the runtime-spec schema (``ocistage.bundler.image.schema``);
:func:`write_runtime_config` validates again and publishes ``config.json`` atomically.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ocistage.bundler.configoptions import ConfigOptions as ConfigOptions
from ocistage.bundler.image.errors import SchemaError
from ocistage.cache.atomicwrite import fsync_dir
from ocistage.cache.errors import StoreError
from ocistage.errors import UsageError
from ocistage.runtimes.rootless import SYSFS_BIND, RootlessIds, make_rootless
from ocistage.runtimes.userdb import ResolvedUser, resolve_user

log = logging.getLogger(__name__)

OCI_VERSION = "1.0.2"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NVIDIA_HOOK = "nvidia-container-runtime-hook"
NVIDIA_HOOK_DEFAULT_PATH = "/usr/bin/nvidia-container-runtime-hook"
CDI_ANNOTATION = "cdi.k8s.io/ocistage"
VOLUMES_ANNOTATION = "io.ocistage.image.volumes"
DROPPED_LABELS_ANNOTATION = "io.ocistage.dropped-labels"
NOFILE_LIMIT = 1024

DEFAULT_CAPABILITIES = ("CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE")

MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")

# Image labels become annotations only where they are known to be descriptive (an allow-list):
# the image-spec's own keys, label-schema's, and plain words ("maintainer", "version"). Runtimes,
# hooks and device plugins act on keys of their own namespaces (crun's run.oci.* and
# module.wasm.image/variant, CRIU's org.criu.config, Kata's io.katacontainers.config.*, CDI
# device requests, systemd properties, ...), and new ones appear with new runtimes: an image
# must not be able to request devices, hooks or runtime behaviour by labelling itself, so any
# other key is left out and named in DROPPED_LABELS_ANNOTATION (the image config keeps them all).
ALLOWED_LABEL_PREFIXES = ("org.opencontainers.image.", "org.label-schema.")
_PLAIN_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
# of the keys left out, those known to change what a runtime does: said as a warning
RUNTIME_LABEL_PREFIXES = (
    "run.oci.",
    "module.wasm.image/",
    "org.criu.",
    "io.katacontainers.",
    "cdi.k8s.io/",
    "org.systemd.property.",
    "io.containers.",
    "io.kubernetes.",
    "io.ocistage.",
    "nvidia.com/",
)


def label_allowed(key: str) -> bool:
    """Whether an image label may become an annotation of the runtime config."""
    return key.startswith(ALLOWED_LABEL_PREFIXES) or _PLAIN_LABEL.match(key) is not None


_ENV_NAME = re.compile(r"^[^=\x00]+$")
_HOSTNAME = re.compile(r"^(?=.{1,64}$)[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$")
#: what NVIDIA_VISIBLE_DEVICES takes besides ``all``: a GPU index, a MIG device index
#: (``0:1``), a GPU or MIG UUID
_GPU_ID = re.compile(r"^(?:[0-9]+(?::[0-9]+)?|(?:GPU|MIG)-[A-Za-z0-9/-]+)$")


def build_runtime_config(image_config: Mapping[str, Any], rootfs: Path,
                         options: ConfigOptions) -> dict[str, Any]:
    """The runtime config for running the image unpacked at ``rootfs`` (bundle's rootfs/)."""
    settings = _section(image_config.get("config"), "config")
    user = _effective_user(resolve_user(rootfs, _optional_str(settings, "User")), options)
    gpus = _gpu_devices(options.gpus)
    config: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": _process(settings, user, options, gpus),
        "root": {"path": "rootfs", "readonly": options.readonly},
        "mounts": _base_mounts() + [_bind_mount(m) for m in options.mounts],
        "linux": _linux(),
        "annotations": _annotations(image_config, settings, gpus),
    }
    if options.hostname is not None:
        config["hostname"] = _hostname(options.hostname)
    if gpus:
        config["hooks"] = {"prestart": [_nvidia_hook()]}
    if options.rootless:
        # the same rules as for the configs Docker/Podman hand to scrun (ocistage.runtimes.rootless)
        config, _ = make_rootless(config, RootlessIds(options.host_uid, options.host_gid,
                                                      options.root_placeholder))
    _validate(config)
    return config


def _validate(config: Mapping[str, Any]) -> None:
    # imported here: jsonschema is ~40 ms of start-up, and a bundle found in the cache
    # writes no config
    from ocistage.bundler.image.schema import validate

    validate(config, "runtime-config")


def write_runtime_config(bundle: Path, config: Mapping[str, Any]) -> Path:
    """Validate ``config`` and publish it as ``bundle/config.json`` (temp file, fsync, rename)."""
    _validate(config)
    target = bundle / "config.json"
    data = (json.dumps(config, indent=2, sort_keys=False) + "\n").encode("utf-8")
    try:
        fd, temp_name = tempfile.mkstemp(prefix=".config.json.", dir=bundle)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fchmod(file.fileno(), 0o644)
                os.fsync(file.fileno())
            os.replace(temp_name, target)
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise
        fsync_dir(bundle)
    except OSError as exc:
        raise StoreError(f"cannot write {target}: {exc.strerror or exc}",
                         "check free space and permissions of the bundle directory") from exc
    return target


def _effective_user(user: ResolvedUser, options: ConfigOptions) -> ResolvedUser:
    """The image user, or container root when a rootless caller asks to be mapped to root.

    runc 1.1 refuses a user namespace without a mapping for container uid 0, and an unprivileged
    caller can map only its own uid: with ``map_root`` the caller becomes root in the container
    (keeping the image user's HOME), which works with every runtime.
    """
    if options.rootless and options.map_root and options.map_self:
        raise UsageError("--map-root and --map-self exclude each other",
                         "--map-self for MPI ranks (srun --mpi=pmix), else --map-root")
    if options.rootless and options.map_root:
        return ResolvedUser(uid=0, gid=0, additional_gids=(), username=None, home=user.home)
    if options.rootless and options.map_self:
        return ResolvedUser(uid=options.host_uid, gid=options.host_gid, additional_gids=(),
                            username=None, home=user.home)
    return user


# --- process -------------------------------------------------------------------------------


def _process(settings: Mapping[str, Any], user: ResolvedUser, options: ConfigOptions,
             gpus: tuple[str, ...]) -> dict[str, Any]:
    process_user: dict[str, Any] = {"uid": user.uid, "gid": user.gid}
    if user.additional_gids:  # rootless: dropped by make_rootless (one gid is mapped)
        process_user["additionalGids"] = list(user.additional_gids)
    caps = list(DEFAULT_CAPABILITIES)
    privileged = user.uid == 0
    return {
        "terminal": options.terminal,
        "user": process_user,
        "args": _args(settings, options),
        "env": _env(settings, user, options, gpus),
        "cwd": _cwd(settings),
        "capabilities": {
            "bounding": caps,
            "effective": caps if privileged else [],
            "permitted": caps if privileged else [],
        },
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": NOFILE_LIMIT, "soft": NOFILE_LIMIT}],
        "noNewPrivileges": True,
    }


def _args(settings: Mapping[str, Any], options: ConfigOptions) -> list[str]:
    """Entrypoint + Cmd with Docker's override rules."""
    if options.entrypoint is not None:
        entrypoint = _option_strings(options.entrypoint, "--entrypoint")
        cmd: list[str] = []  # docker run --entrypoint clears the image's Cmd
    else:
        entrypoint = _image_strings(settings, "Entrypoint")
        cmd = _image_strings(settings, "Cmd")
    if options.args is not None:
        cmd = _option_strings(options.args, "--cmd")
    if entrypoint == [""]:
        entrypoint = []
    args = entrypoint + cmd
    if not args:
        raise UsageError(_nothing_to_run(options),
                         "give the command to run: --cmd ARG (once per argument) or "
                         "--entrypoint ARG; with submit, after --")
    return args


def _nothing_to_run(options: ConfigOptions) -> str:
    """Why the container would have no command: the image's, or the options' doing."""
    if options.entrypoint is not None:  # [""]: an empty one clears both
        return ("--entrypoint '' clears the image's Entrypoint and Cmd, so there is nothing "
                "to run")
    return "the image defines no Entrypoint or Cmd, so there is nothing to run"


def _env(settings: Mapping[str, Any], user: ResolvedUser, options: ConfigOptions,
         gpus: tuple[str, ...]) -> list[str]:
    """Image Env, then the caller's overrides, then defaults for names still unset."""
    merged: dict[str, str] = {}
    for entry in _image_strings(settings, "Env"):
        name, value = _split_env(entry)
        if name is None:
            raise SchemaError(f"image config Env entry {entry!r} is not NAME=value",
                              "the image configuration is malformed; rebuild the image")
        merged[name] = value
    for entry in _option_strings(options.env, "--env"):
        name, value = _split_env(entry)
        if name is None:
            raise UsageError(f"--env {entry!r} is not NAME=value",
                             "give environment variables as NAME=value")
        merged[name] = value
    if gpus:
        merged["NVIDIA_VISIBLE_DEVICES"] = ",".join(gpus)
    defaults = {"PATH": DEFAULT_PATH, "HOME": user.home}
    if options.terminal:
        defaults["TERM"] = "xterm"
    if gpus:
        defaults["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
    for name, value in defaults.items():
        merged.setdefault(name, value)
    return [f"{name}={value}" for name, value in merged.items()]


def _split_env(entry: str) -> tuple[str | None, str]:
    name, sep, value = entry.partition("=")
    if not sep or not _ENV_NAME.match(name) or "\x00" in value:
        return None, ""
    return name, value


def _cwd(settings: Mapping[str, Any]) -> str:
    working_dir = _optional_str(settings, "WorkingDir") or "/"
    if "\x00" in working_dir:
        raise SchemaError("image config WorkingDir contains a NUL byte",
                          "the image configuration is malformed; rebuild the image")
    return posixpath.normpath(posixpath.join("/", working_dir))


# --- mounts --------------------------------------------------------------------------------


def _base_mounts() -> list[dict[str, Any]]:
    # rootless: make_rootless drops gid=5 (tty is unmapped in a one-id user namespace)
    devpts_options = ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": devpts_options},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        # sysfs cannot be mounted without owning a network namespace: bind the host's, read-only.
        dict(SYSFS_BIND),
    ]


def _bind_mount(spec: str) -> dict[str, Any]:
    """``SRC:DST[:ro|:rw]`` -> a recursive bind mount (read-only when asked)."""
    parts = spec.split(":")
    hint = "give mounts as SRC:DST or SRC:DST:ro, with an absolute DST (paths without ':')"
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise UsageError(f"--mount {spec!r} is not SRC:DST[:ro]", hint)
    source, destination = parts[0], parts[1]
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw"):
        raise UsageError(f"--mount {spec!r}: unknown mode {mode!r} (ro or rw)", hint)
    if (not destination.startswith("/") or ".." in destination.split("/")
            or destination.strip("/") == ""):
        raise UsageError(f"--mount {spec!r}: destination must be an absolute path below / "
                         "without '..'", hint)
    if "\x00" in spec:
        raise UsageError("--mount contains a NUL byte", hint)
    return {
        "destination": "/" + "/".join(p for p in destination.split("/") if p not in ("", ".")),
        "type": "bind",
        "source": os.path.abspath(source),
        "options": ["rbind", "rprivate", mode],
    }


# --- linux ---------------------------------------------------------------------------------


def _linux() -> dict[str, Any]:
    namespaces = [{"type": kind} for kind in ("pid", "ipc", "uts", "mount")]
    linux: dict[str, Any] = {"namespaces": namespaces}  # rootless: make_rootless adds user
    linux["maskedPaths"] = list(MASKED_PATHS)
    linux["readonlyPaths"] = list(READONLY_PATHS)
    return linux


def _hostname(hostname: str) -> str:
    if not _HOSTNAME.match(hostname):
        raise UsageError(f"invalid hostname {hostname!r}",
                         "a hostname is up to 64 letters, digits, '-' and '.'")
    return hostname


# --- GPUs ----------------------------------------------------------------------------------


def _gpu_devices(gpus: str | None) -> tuple[str, ...]:
    """``"all"`` or a comma-separated list of GPU indices/UUIDs; () when no GPUs are asked."""
    if gpus is None:
        return ()
    devices = tuple(part.strip() for part in gpus.split(","))
    if devices != ("all",) and not all(_GPU_ID.match(device) for device in devices):
        raise UsageError(f"invalid --gpus {gpus!r}",
                         "use --gpus all or a list of GPU indices (0,1), MIG devices (0:1) or "
                         "UUIDs (GPU-..., MIG-...)")
    return devices


def gpu_hook_missing(gpus: str | None) -> str | None:
    """A warning when GPUs are asked for and this host has no NVIDIA hook: the bundle names
    its default path, which must exist where the bundle runs."""
    if not gpus or shutil.which(NVIDIA_HOOK) or os.path.exists(NVIDIA_HOOK_DEFAULT_PATH):
        return None
    return (f"{NVIDIA_HOOK} is not installed on this host: config.json runs "
            f"{NVIDIA_HOOK_DEFAULT_PATH}, which must exist where the bundle runs "
            "(nvidia-container-toolkit)")


def _nvidia_hook() -> dict[str, Any]:
    path = shutil.which(NVIDIA_HOOK) or NVIDIA_HOOK_DEFAULT_PATH
    return {"path": os.path.abspath(path), "args": [NVIDIA_HOOK, "prestart"]}


def _cdi_value(gpus: tuple[str, ...]) -> str:
    return ",".join(f"nvidia.com/gpu={device}" for device in gpus)


# --- annotations ---------------------------------------------------------------------------


def _annotations(image_config: Mapping[str, Any], settings: Mapping[str, Any],
                 gpus: tuple[str, ...]) -> dict[str, str]:
    """Implicit annotations, then Labels (which win on conflicts), then ocistage's own."""
    annotations = _implicit_annotations(image_config, settings)
    annotations.update(_label_annotations(settings))
    volumes = _section(settings.get("Volumes"), "config.Volumes")
    if volumes:
        annotations[VOLUMES_ANNOTATION] = ",".join(volumes)
    if gpus:
        annotations[CDI_ANNOTATION] = _cdi_value(gpus)
    return annotations


def _implicit_annotations(image_config: Mapping[str, Any],
                          settings: Mapping[str, Any]) -> dict[str, str]:
    """conversion.md's annotations from the image config's own fields."""
    annotations: dict[str, str] = {}
    for field_name in ("os", "architecture", "variant", "os.version", "author", "created"):
        value = image_config.get(field_name)
        if isinstance(value, str) and value:
            annotations[f"org.opencontainers.image.{field_name}"] = value
    features = image_config.get("os.features")
    if isinstance(features, list) and features:
        annotations["org.opencontainers.image.os.features"] = ",".join(map(str, features))
    stop_signal = _optional_str(settings, "StopSignal")
    if stop_signal:
        annotations["org.opencontainers.image.stopSignal"] = stop_signal
    ports = _section(settings.get("ExposedPorts"), "config.ExposedPorts")
    if ports:
        annotations["org.opencontainers.image.exposedPorts"] = ",".join(ports)
    return annotations


def _label_annotations(settings: Mapping[str, Any]) -> dict[str, str]:
    """The labels on the allow-list (:func:`label_allowed`); the others named in
    :data:`DROPPED_LABELS_ANNOTATION`."""
    annotations: dict[str, str] = {}
    dropped: list[str] = []
    for key, value in _section(settings.get("Labels"), "config.Labels").items():
        if not isinstance(value, str) or not key:
            raise SchemaError(f"image config label {key!r} is not a non-empty key with a "
                              "string value", "the image configuration is malformed")
        if label_allowed(key):
            annotations[key] = value
        else:
            dropped.append(key)
    if dropped:
        acted_on = [key for key in dropped if key.startswith(RUNTIME_LABEL_PREFIXES)]
        if acted_on:
            log.warning("image labels not converted to annotations (runtimes act on them): %s",
                        ", ".join(acted_on))
        log.info("image labels not converted to annotations (not on the allow-list): %s",
                 ", ".join(dropped))
        annotations[DROPPED_LABELS_ANNOTATION] = ",".join(dropped)
    return annotations


# --- reading the image config --------------------------------------------------------------


def _section(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SchemaError(f"image config {where} is not an object",
                          "the image configuration is malformed; rebuild the image")
    return value


def _optional_str(settings: Mapping[str, Any], key: str) -> str | None:
    value = settings.get(key)
    if value is None or isinstance(value, str):
        return value
    raise SchemaError(f"image config config.{key} is not a string",
                      "the image configuration is malformed; rebuild the image")


def _image_strings(settings: Mapping[str, Any], key: str) -> list[str]:
    value = settings.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SchemaError(f"image config config.{key} is not an array of strings",
                          "the image configuration is malformed; rebuild the image")
    return list(value)


def _option_strings(value: Sequence[str], option: str) -> list[str]:
    if isinstance(value, str) or not all(isinstance(item, str) for item in value):
        raise UsageError(f"{option} must be a list of strings, got {value!r}")
    return list(value)
