"""Run an OCI runtime bundle (``rootfs/`` + ``config.json``) under rootless runc or crun.

Each run gets its own runtime state directory (``--root``) and a unique container id, and the
container is deleted afterwards, whatever happened; nothing is left in the runtime's default
state directory.

Which runtime can run a bundle for the caller (``runtime=None`` takes the first that can, runc
before crun; a runtime named that cannot skips the test saying why, a failure under
OCISTAGE_REQUIRE_E2E=1):

- runc before 1.2, run by a user other than root, cannot run a bundle whose container root is
  not the caller: a bundle of an image user other than root maps the caller to that user and
  container 0 to a subordinate id (``ocistage.runtimes.idmap``), and ``runc run`` ``fchown``s
  the stdio pipes it makes for the container to the host id of container root
  (libcontainer's ``Process.InitializeIO``), which only root may do: ``runc run failed: fchown
  fd 7: operation not permitted``, exit 1, no output (``run -d`` fails the same way on
  ``exec.fifo``). Debian 12 ships runc 1.1.5; crun, runc 1.2 and bundles made with
  ``--map-root`` do not have the problem.
- crun 1.8 refuses every container on a hybrid cgroup v1+v2 host whose v2 hierarchy has
  controllers ("cgroups in hybrid mode not supported"). There crun runs in a private mount
  namespace with the v2 hierarchy hidden (a test-host workaround: the host's mounts are
  untouched): root unmounts it; a user mounts an empty tmpfs over it in a user namespace of its
  own that maps the caller's ids and its ``/etc/subuid``/``subgid`` ranges to themselves
  (``unshare --map-user --map-users``, newuidmap), so the bundle's mappings mean there what
  they mean outside.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from ocistage.runtimes.userrun import RUNC_WITHOUT_ROOT_MAPPING, runc_version
from pytest_ocistage.components import (
    Outcome,
    component_unavailable,
    require_binary,
    running_as_root,
)

RUNTIMES = ("runc", "crun")
HYBRID_CGROUP2 = "/sys/fs/cgroup/unified"


@dataclass(frozen=True)
class BundleRun(Outcome):
    """What the container's process did, and under which runtime."""

    runtime: str


def run_bundle(bundle: Path, state_dir: Path, runtime: str | None = None,
               timeout: float = 120) -> BundleRun:
    """Run bundle to completion with ``RUNTIME --rootless=true run`` and capture its output.

    ``runtime=None``: runc, or crun where runc cannot run the bundle for this caller (the
    module docstring). A runtime missing, or none that can run it, skips the test with the
    reason and what to install (a failure under OCISTAGE_REQUIRE_E2E=1).
    """
    if runtime is not None and runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
    runtime, binary = _choose(bundle, runtime)
    state_dir.mkdir(parents=True, exist_ok=True)
    container = f"ocistage-test-{uuid.uuid4().hex[:12]}"
    base = [*hybrid_cgroup_prefix(runtime), binary, "--rootless=true",
            "--root", str(state_dir)]
    try:
        result = subprocess.run([*base, "run", "--bundle", str(bundle), container],
                                capture_output=True, text=True, timeout=timeout,
                                stdin=subprocess.DEVNULL, check=False)
    finally:
        subprocess.run([*base, "delete", "--force", container], capture_output=True,
                       timeout=60, stdin=subprocess.DEVNULL, check=False)
    return BundleRun(returncode=result.returncode, stdout=result.stdout, stderr=result.stderr,
                     runtime=runtime)


def _choose(bundle: Path, runtime: str | None) -> tuple[str, str]:
    """The runtime and its binary that run bundle here, or skip/fail saying why not."""
    if runtime is not None:
        binary = require_binary(runtime)
        problem = cannot_run(runtime, binary, bundle)
        if problem is not None:
            component_unavailable(problem)
        return runtime, binary
    problems: list[str] = []
    for name in RUNTIMES:
        found = shutil.which(name)
        if found is None:
            problems.append(f"{name} is not installed (apt-get install {name})")
            continue
        problem = cannot_run(name, found, bundle)
        if problem is None:
            return name, found
        problems.append(problem)
    component_unavailable("no rootless runtime here can run this bundle: " + "; ".join(problems))


def cannot_run(runtime: str, binary: str, bundle: Path) -> str | None:
    """Why ``runtime`` cannot run bundle for this caller here (the module docstring), or None."""
    if running_as_root():
        return None
    if runtime == "runc":
        version = runc_version(binary)
        if version is None or version >= RUNC_WITHOUT_ROOT_MAPPING:
            return None
        root_host = _container_root_host_uid(bundle)
        if root_host == os.getuid():
            return None
        shown = ".".join(map(str, version))
        where = ("is not mapped" if root_host is None
                 else f"maps to host uid {root_host}, not to you ({os.getuid()})")
        return (f"runc {shown} cannot run {bundle} for a user other than root: its container "
                f"root {where}, and runc before 1.2 refuses an unmapped container root or "
                "fchowns its stdio pipes to that id ('fchown fd 7: operation not permitted', "
                "which only root may do); install crun (apt-get install crun) or runc 1.2 or "
                "later, or make the bundle with --map-root (the process then runs as root)")
    if hybrid_cgroups() and _subordinate_range(os.getuid(), "subuid") is None and \
            _mapped_ids(bundle) - {os.getuid()}:
        return (f"crun refuses this hybrid cgroup host and {bundle} maps ids other than yours: "
                "hiding cgroup v2 in a user namespace of yours needs a range in /etc/subuid "
                "and /etc/subgid and newuidmap (apt-get install uidmap)")
    return None


def _config(bundle: Path) -> dict[str, object]:
    try:
        loaded = json.loads((bundle / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _uid_mappings(bundle: Path) -> list[dict[str, int]]:
    linux = _config(bundle).get("linux")
    mappings = linux.get("uidMappings") if isinstance(linux, dict) else None
    return [m for m in mappings or [] if isinstance(m, dict)]


def _container_root_host_uid(bundle: Path) -> int | None:
    """The host uid container uid 0 maps to; the caller's with no user namespace mapping."""
    mappings = _uid_mappings(bundle)
    if not mappings:
        return os.getuid()
    for mapping in mappings:
        start, size = mapping.get("containerID", -1), mapping.get("size", 0)
        if start <= 0 < start + size:
            return int(mapping.get("hostID", -1))
    return None


def _mapped_ids(bundle: Path) -> set[int]:
    return {int(m.get("hostID", -1)) for m in _uid_mappings(bundle)}


def _subordinate_range(uid: int, kind: str) -> tuple[int, int] | None:
    """The first ``/etc/subuid`` (``kind="subgid"``: subgid) range of the user uid."""
    try:
        names = {pwd.getpwuid(uid).pw_name, str(uid)}
        lines = Path("/etc", kind).read_text().splitlines()
    except (KeyError, OSError):
        return None
    for line in lines:
        fields = line.strip().split(":")
        if len(fields) == 3 and fields[0] in names and fields[1].isdigit() \
                and fields[2].isdigit() and int(fields[2]) > 0:
            return int(fields[1]), int(fields[2])
    return None


def hybrid_cgroups() -> bool:
    """Whether this is a cgroup v1+v2 hybrid host whose v2 hierarchy has controllers."""
    controllers = Path(HYBRID_CGROUP2, "cgroup.controllers")
    return os.path.ismount(HYBRID_CGROUP2) and controllers.exists() and bool(
        controllers.read_text().strip())


def hybrid_cgroup_prefix(runtime: str) -> list[str]:
    """The argv prefix that lets crun run on a hybrid host (see the module docstring)."""
    if runtime != "crun" or not hybrid_cgroups():
        return []
    if running_as_root():
        return [require_binary("unshare"), "-m", "--propagation", "private", "sh", "-c",
                f'umount {HYBRID_CGROUP2} && exec "$@"', "sh"]
    ids = [f"--map-user={os.getuid()}", f"--map-group={os.getgid()}"]
    subuid, subgid = _subordinate_range(os.getuid(), "subuid"), \
        _subordinate_range(os.getuid(), "subgid")
    if subuid is not None and subgid is not None:
        require_binary("newuidmap")
        ids += [f"--map-users={subuid[0]},{subuid[0]},{subuid[1]}",
                f"--map-groups={subgid[0]},{subgid[0]},{subgid[1]}"]
    return [require_binary("unshare"), "--user", "--mount", "--propagation", "private", *ids,
            "--keep-caps", "sh", "-c",
            f'mount -t tmpfs -o size=4k,mode=0555 ocistage-test {HYBRID_CGROUP2} && exec "$@"',
            "sh"]
