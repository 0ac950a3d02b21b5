"""The doctor's checks of the OCI runtimes (runc, crun): their versions, and what each
refuses here."""

from __future__ import annotations

import re
from pathlib import Path

from ocistage.bundler.doctor.probes import command_output, read_text
from ocistage.bundler.doctor.report import Check, missing, ok, warn

#: runc releases before this refuse, for a user, a container root that is not the caller
RUNC_OWN_ROOT_FIXED = (1, 2)
CGROUP_UNIFIED = Path("/sys/fs/cgroup/unified/cgroup.controllers")


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``(1, 1, 5)`` from ``runc version 1.1.5+ds1`` or ``crun version 1.8.1``."""
    match = re.search(r"version (\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if match is None:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


def _shown(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def check_runc(version_text: str | None, uid: int, crun_found: bool) -> Check:
    """runc: its version and, for a user, runc 1.1's refusal of a container root that is not
    the caller (docs/runtime-config.md, ``map_root``)."""
    if version_text is None:
        return _runtime_absent("runc", crun_found)
    version = parse_version(version_text)
    if version is None:
        return warn("runc", "runc --version printed no version", "reinstall runc")
    if uid != 0 and version[:2] < RUNC_OWN_ROOT_FIXED:
        return warn("runc", f"runc {_shown(version)}: as a user it cannot run a non-root "
                            "image's bundle (container root is not you: `runc run` fails "
                            "with `fchown ...: operation not permitted`)",
                    "bundle with --map-root for runc, or run bundles with crun or runc >= 1.2")
    return ok("runc", f"runc {_shown(version)}")


def check_crun(version_text: str | None, runc_found: bool,
               unified_controllers: str | None) -> Check:
    """crun: its version and the hybrid cgroup layout it refuses (controllers on both the v1
    hierarchies and the cgroup2 one)."""
    if version_text is None:
        return _runtime_absent("crun", runc_found)
    version = parse_version(version_text)
    if version is None:
        return warn("crun", "crun --version printed no version", "reinstall crun")
    controllers = (unified_controllers or "").split()
    if controllers:
        return warn("crun", f"crun {_shown(version)}: this host's cgroups are hybrid (v1, "
                            f"and cgroup2 controllers {' '.join(controllers)}): crun exits "
                            "with `cgroups in hybrid mode not supported`",
                    "run bundles with runc here, or boot with a unified (v2-only) cgroup "
                    "hierarchy (systemd.unified_cgroup_hierarchy=1)")
    return ok("crun", f"crun {_shown(version)}")


def _runtime_absent(name: str, other_found: bool) -> Check:
    other = "crun" if name == "runc" else "runc"
    if other_found:
        return warn(name, f"{name} is not on PATH ({other} is)",
                    f"none needed; for {name}: apt install {name}")
    return missing(name, "no OCI runtime (runc or crun) on PATH: bundles cannot run here",
                   "apt install crun (or runc)")


def runtime_checks(uid: int) -> list[Check]:
    runc = command_output(["runc", "--version"])
    crun = command_output(["crun", "--version"])
    controllers = read_text(CGROUP_UNIFIED)
    return [check_runc(runc, uid, crun is not None),
            check_crun(crun, runc is not None, controllers)]
