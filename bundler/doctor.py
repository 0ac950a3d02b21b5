"""``ocistage doctor``: what this host can do, what is missing, and what to do about it.

Every check is a small function that takes what it judges (a file's text, a command's output,
a ``stat`` result, a setting) and returns one :class:`Check`: ``ok``, ``warn`` (works, with a
limit worth knowing) or ``missing`` (something a command needs is absent or refused), with the
fix. The probes that gather those inputs (:func:`read_text`, :func:`command_output`, ...) are
kept apart, so each check is tested with fake inputs. :func:`diagnose` runs them all.

A check is ``core`` when ``pull``, ``bundle``, ``stage`` or the ``cache`` commands depend on
it (the cache, the configured stage target, the config files and CA file, a registry asked
about); ``ocistage doctor`` exits 1 when one of them is missing. The others (runtimes, user
namespaces, FUSE, squashfs tools, Slurm) say what running bundles, squashfs stages and Slurm
jobs need here. Nothing is changed: no directory is made, no file written.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.bundler.errors import MissingForCore
from ocistage.cache.fsops import check_path_trusted, trust_problem
from ocistage.cache.sizes import format_size
from ocistage.errors import OcistageError

if TYPE_CHECKING:
    from ocistage.bundler.settings import Settings
    from ocistage.results import Renderer
    from ocistage.runtimes.slurm import SlurmVersion

#: below this much free space a cache or stage target is a warning (one image's bundle)
LOW_SPACE = 2 << 30
#: how long one probed command may take
PROBE_TIMEOUT = 20.0
#: runc releases before this refuse, for a user, a container root that is not the caller
RUNC_OWN_ROOT_FIXED = (1, 2)
#: ``SLURM_CONF = PATH`` in what ``scontrol show config`` prints: the slurm.conf this node's
#: Slurm reads, wherever it was built to look (a prefix build's own etc/, a configless cache)
_SLURM_CONF_LINE = re.compile(r"^SLURM_CONF\s*=\s*(\S.*?)\s*$", re.MULTILINE)
CGROUP_UNIFIED = Path("/sys/fs/cgroup/unified/cgroup.controllers")


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    MISSING = "missing"


@dataclass(frozen=True)
class Check:
    """One line of the report: ``name`` (a component or setting), how it stands, what was
    found, and what to do (``fix``, for warn and missing)."""

    name: str
    status: Status
    detail: str
    fix: str | None = None
    core: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": str(self.status), "detail": self.detail,
                "fix": self.fix, "core": self.core}


def ok(name: str, detail: str, *, core: bool = False) -> Check:
    return Check(name, Status.OK, detail, None, core)


def warn(name: str, detail: str, fix: str, *, core: bool = False) -> Check:
    return Check(name, Status.WARN, detail, fix, core)


def missing(name: str, detail: str, fix: str | None, *, core: bool = False) -> Check:
    return Check(name, Status.MISSING, detail, fix, core)


@dataclass(frozen=True)
class DoctorReport:
    """Every check, in the order run; :attr:`ok` when no core check is missing."""

    user: str
    uid: int
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return not self.core_missing()

    def core_missing(self) -> list[Check]:
        return [c for c in self.checks if c.core and c.status is Status.MISSING]

    def to_json(self) -> dict[str, Any]:
        """What ``doctor --json`` prints."""
        return {"ok": self.ok, "user": self.user, "uid": self.uid,
                "checks": [check.to_json() for check in self.checks]}

    def render(self, out: Renderer) -> None:
        width = max((len(check.name) for check in self.checks), default=0)
        for check in self.checks:
            fix = f"; fix: {check.fix}" if check.fix and check.status is not Status.OK else ""
            out.line(f"{check.status:<7}  {check.name:<{width}}  {check.detail}{fix}")
        others = [c for c in self.checks if not c.core and c.status is Status.MISSING]
        core = self.core_missing()
        if not core:
            out.note("nothing the core commands (pull, bundle, stage, cache) need is missing"
                     + (f"; missing for other uses: {', '.join(c.name for c in others)}"
                        if others else ""))



def core_problem(report: DoctorReport) -> MissingForCore | None:
    """The error ``doctor`` ends with when the core commands lack something, else None."""
    core = report.core_missing()
    if not core:
        return None
    return MissingForCore("missing for pull, bundle, stage or cache: "
                          + ", ".join(c.name for c in core))


# -- probes: what the checks judge ----------------------------------------------------------


def read_text(path: Path, limit: int = 1 << 20) -> str | None:
    """The text of a small file (``/proc/sys``, ``/etc/subuid``), None if it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return None


def command_output(argv: list[str]) -> str | None:
    """stdout and stderr of ``argv`` (looked up on PATH), None if it is not there or cannot be
    run; the exit status is not judged here. Bounded (:func:`ocistage.runtimes.probe.probe`):
    at most 64 KiB, decoded with replacement characters, the tool killed after 20 s."""
    from ocistage.runtimes.probe import probe

    result = probe(argv, timeout=PROBE_TIMEOUT)
    return None if result is None else result.output


def free_space(path: Path) -> int | None:
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def existing_ancestor(path: Path) -> Path:
    """``path`` or the nearest directory above it that exists."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# -- runtimes -------------------------------------------------------------------------------


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


# -- user namespaces and subordinate ids -------------------------------------------------


def check_userns(clone: str | None, max_namespaces: str | None, apparmor: str | None,
                 uid: int) -> Check:
    """Whether the caller may make user namespaces: Debian's ``unprivileged_userns_clone``,
    ``user.max_user_namespaces``, Ubuntu's AppArmor restriction."""
    if (max_namespaces or "").strip() == "0":
        return missing("userns", "user.max_user_namespaces is 0: no user namespaces, no "
                                 "rootless containers",
                       "as root: sysctl -w user.max_user_namespaces=15000 (and in "
                       "/etc/sysctl.d/)")
    if uid == 0:
        return ok("userns", "root may make user namespaces")
    if (clone or "").strip() == "0":
        return missing("userns", "kernel.unprivileged_userns_clone is 0: users cannot make "
                                 "user namespaces (rootless runc/crun fail)",
                       "as root: sysctl -w kernel.unprivileged_userns_clone=1 (and in "
                       "/etc/sysctl.d/)")
    if (apparmor or "").strip() == "1":
        return warn("userns", "kernel.apparmor_restrict_unprivileged_userns is 1: AppArmor "
                              "denies user namespaces to programs without a profile allowing "
                              "them",
                    "as root: an AppArmor profile with `userns,` for runc/crun, or sysctl -w "
                    "kernel.apparmor_restrict_unprivileged_userns=0")
    limit = (max_namespaces or "?").strip()
    return ok("userns", f"users may make user namespaces (max_user_namespaces {limit})")


def check_subuid(etc: Path, uid: int, name: str, newuidmap: bool) -> Check:
    """The caller's ``/etc/subuid`` and ``/etc/subgid`` range (what container root of a
    non-root image maps to, runtimes/idmap.py)."""
    from ocistage.runtimes.idmap import OVERFLOW_ID, subordinate_start

    if uid == 0:
        return ok("subuid", f"root maps any id (a non-root image's container root maps to "
                            f"{OVERFLOW_ID})")
    names = (name, str(uid))
    start_uid = subordinate_start(etc / "subuid", names)
    start_gid = subordinate_start(etc / "subgid", names)
    if start_uid is None or start_gid is None:
        absent = " and ".join(f"{etc / f}" for f, s in (("subuid", start_uid),
                                                         ("subgid", start_gid)) if s is None)
        return warn("subuid", f"no range for {name} in {absent}: a non-root image's "
                              "container root stays unmapped (fine for crun and runc >= 1.2)",
                    f"as root: usermod --add-subuids 100000-165535 --add-subgids "
                    f"100000-165535 {name}")
    if not newuidmap:
        return warn("subuid", f"{name} has ranges from {start_uid}/{start_gid}, but "
                              "newuidmap/newgidmap are not installed", "apt install uidmap")
    return ok("subuid", f"{name}'s ranges start at {start_uid}/{start_gid} (newuidmap "
                        "installed)")


def check_runtime_dir(value: str | None, uid: int, st: os.stat_result | None) -> Check:
    """``$XDG_RUNTIME_DIR``: where a user's runc and crun keep their state by default."""
    if uid == 0:
        return ok("xdg_runtime_dir", "root: runc and crun keep state in /run")
    fix = ("log in through PAM/systemd (or `loginctl enable-linger`), or give the runtime "
           "--root DIR: runc --root \"$HOME/.runc\" run ...")
    if not value:
        return warn("xdg_runtime_dir", "XDG_RUNTIME_DIR is not set: `runc run` fails "
                                       "(`lstat /run/runc/...: permission denied`)", fix)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return warn("xdg_runtime_dir", f"XDG_RUNTIME_DIR={value} is not a directory", fix)
    if st.st_uid != uid or st.st_mode & 0o077:
        return warn("xdg_runtime_dir", f"XDG_RUNTIME_DIR={value} is not yours alone "
                                       f"(owner {user_name(st.st_uid)}, mode "
                                       f"{stat.S_IMODE(st.st_mode):o})", fix)
    return ok("xdg_runtime_dir", f"{value}")


# -- FUSE and squashfs tools ------------------------------------------------------------------


@dataclass(frozen=True)
class FuseFacts:
    """What a squashfuse mount needs: /dev/fuse, fusermount for a user, fuse.conf."""

    device: os.stat_result | None
    usable: bool  # the caller may open /dev/fuse read-write
    fusermount: bool
    fuse_conf: str | None


def check_fuse(facts: FuseFacts, uid: int) -> Check:
    """Whether squashfuse can mount here (``stage --format squashfs`` mounts its image, and
    unpacks it with unsquashfs when it cannot)."""
    fallback = "squashfs stages are unpacked instead of mounted"
    if facts.device is None or not stat.S_ISCHR(facts.device.st_mode):
        return warn("fuse", f"no /dev/fuse: {fallback}", "as root: modprobe fuse")
    mode = stat.filemode(facts.device.st_mode)
    if not facts.usable:
        return warn("fuse", f"/dev/fuse ({mode} {user_name(facts.device.st_uid)}) is not "
                            f"open to you: {fallback}", "as root: chmod 666 /dev/fuse")
    if uid != 0 and not facts.fusermount:
        return warn("fuse", f"no fusermount/fusermount3: {fallback}", "apt install fuse3")
    allow_other = any(line.strip() == "user_allow_other"
                      for line in (facts.fuse_conf or "").splitlines())
    if uid != 0 and not allow_other:
        return warn("fuse", "/etc/fuse.conf lacks user_allow_other: a squashfs mount is "
                            "yours alone (a container user other than you cannot read it)",
                    "as root: add user_allow_other to /etc/fuse.conf")
    return ok("fuse", f"/dev/fuse ({mode}) usable")


def check_squashfuse(squashfuse: str | None, squashfuse_ll: str | None) -> Check:
    found = [path for path in (squashfuse, squashfuse_ll) if path]
    if squashfuse is None:
        return missing("squashfuse", "squashfuse is not on PATH: squashfs stages are unpacked "
                                     "instead of mounted" + (f" ({squashfuse_ll} alone is not "
                                                             "used)" if squashfuse_ll else ""),
                       "apt install squashfuse")
    return ok("squashfuse", ", ".join(found))


def check_mksquashfs(mksquashfs: str | None, help_text: str | None,
                     unsquashfs: str | None) -> Check:
    """mksquashfs and its compressors: ``stage --format squashfs`` writes zstd, the pyxis
    importer zstd or gzip; unsquashfs unpacks an image where FUSE does not mount it."""
    from ocistage.stagers.mksquashfs import compressors_listed

    if mksquashfs is None:
        return missing("mksquashfs", "mksquashfs is not on PATH: no stage --format squashfs, "
                                     "no ocistage-pyxis-importer", "apt install squashfs-tools")
    listed = compressors_listed(help_text or "")
    if not listed:
        return warn("mksquashfs", f"{mksquashfs} -help lists no compressors",
                    "install squashfs-tools 4.4 or later")
    shown = f"compressors {', '.join(listed)}"
    if "zstd" not in listed:
        return warn("mksquashfs", f"{shown}: no zstd, which stage --format squashfs writes",
                    "install a squashfs-tools built with zstd")
    if unsquashfs is None:
        return warn("mksquashfs", f"{shown}; no unsquashfs (squashfs stages where FUSE "
                                  "cannot mount)", "apt install squashfs-tools")
    return ok("mksquashfs", shown)


# -- settings, cache, stage target, CA file ------------------------------------------------


def check_config(settings: Settings | None, error: OcistageError | None) -> Check:
    if error is not None:
        return missing("config", error.message, error.hint, core=True)
    assert settings is not None
    files = sorted({origin.removeprefix("file ") for origin in settings.origins.values()
                    if origin.startswith("file ")})
    where = f"from {', '.join(files)}" if files else "no config file"
    if settings.warnings:
        return warn("config", f"{where}: {settings.warnings[0]}"
                    + (f" (and {len(settings.warnings) - 1} more)"
                       if len(settings.warnings) > 1 else ""),
                    "fix or remove the key (docs/config.md)", core=True)
    return ok("config", where, core=True)


def check_ca_file(path: str | None, origin: str) -> Check | None:
    """The extra CA bundle, checked as a registry client checks it (None: none given)."""
    if path is None:
        return None
    from ocistage.bundler.registry.cafile import check_ca_file as parse
    from ocistage.bundler.registry.errors import CaFileError

    try:
        count = parse(path, origin)
    except CaFileError as exc:
        return missing("ca_file", exc.message, exc.hint, core=True)
    return ok("ca_file", f"{path} ({origin}): {count} CA certificate{'s' * (count != 1)}",
              core=True)


def _space(name: str, free: int | None, said: str, *, core: bool) -> Check:
    if free is not None and free < LOW_SPACE:
        other = "--cache" if name == "cache" else "--to"
        return warn(name, f"{said}; only {format_size(free)} free on its filesystem",
                    f"free space there, or choose another ({other})", core=core)
    room = f", {format_size(free)} free" if free is not None else ""
    return ok(name, f"{said}{room}", core=core)


def check_cache(path: Path, st: os.stat_result | None, writable: bool,
                free: int | None, parent: Path | None = None) -> Check:
    """The cache directory: the trust rule of a group-shareable cache (docs/trust.md),
    writable, room. ``st`` None: it does not exist yet, ``parent`` is where it will be made."""
    fix = "use a cache of your own: --cache DIR, $OCISTAGE_CACHE or `cache` in the config file"
    if st is None:
        if not writable:
            return missing("cache", f"{path} does not exist and cannot be made in {parent}",
                           fix, core=True)
        return _space("cache", free, f"{path} (made on first use in {parent})", core=True)
    problem = trust_problem(st, group_shared=True)
    if problem is not None:
        return missing("cache", f"{path} {problem}: ocistage refuses it", fix, core=True)
    if not writable:
        return missing("cache", f"{path} is not writable by you", fix, core=True)
    return _space("cache", free, f"{path} (yours)" if st.st_uid == os.geteuid()
                  else f"{path} (owner {user_name(st.st_uid)})", core=True)


def check_stage_target(target: str | None, origin: str,
                       judge: Callable[[Path], Check]) -> Check:
    """The stage target ``stage`` and ``submit`` use: none, a URL (judged when staging), or a
    directory (``judge``)."""
    if not target:
        return warn("stage_target", "none configured: `stage` needs --to",
                    "pass --to DIR|URL, set $OCISTAGE_STAGE_TO, or put stage_to in the config "
                    "file", core=True)
    if "://" in target:
        return ok("stage_target", f"{target} ({origin}): a URL, reached when staging",
                  core=True)
    return judge(Path(target))


def judge_stage_dir(path: Path) -> Check:
    """A stage target directory as ``stage`` judges it (every directory on the way trusted,
    the target the caller's or root's or a sticky one), without making anything."""
    from ocistage.cache.fsops import ANCESTOR_HINT

    place = existing_ancestor(path)
    try:
        check_path_trusted(place, "stage target", shared=True)
    except OcistageError as exc:
        return missing("stage_target", exc.message, exc.hint or ANCESTOR_HINT, core=True)
    if not place.is_dir():
        return missing("stage_target", f"{place} is not a directory",
                       "give --to a directory (or stage_to)", core=True)
    if not os.access(place, os.W_OK | os.X_OK):
        return missing("stage_target", f"{place} is not writable by you",
                       "choose a target you can write (--to, stage_to)", core=True)
    said = f"{path}" if place == path else f"{path} (made on first use in {place})"
    return _space("stage_target", free_space(place), said, core=True)


# -- Slurm --------------------------------------------------------------------------------


def check_slurm(version: SlurmVersion | None, error: str | None) -> Check:
    if version is None:
        return missing("slurm", f"no Slurm commands here ({error}): submit, runtime oci-conf "
                                "and the scrun hooks need them",
                       "load the Slurm environment, or install slurm-client")
    return ok("slurm", f"Slurm {version}.{version.patch} (scontrol --version)")


def check_oci_conf(path: Path, text_problems: list[str] | None, version: SlurmVersion) -> Check:
    """Slurm's ``oci.conf`` linted for ``version`` (``runtime oci-conf --check``); None
    problems: the file is not there."""
    if text_problems is None:
        return warn("oci.conf", f"no {path}: `srun/sbatch --container` do not run containers "
                                "on this node",
                    f"as root: ocistage runtime oci-conf --runtime runc > {path}")
    if text_problems:
        more = f" (and {len(text_problems) - 1} more)" if len(text_problems) > 1 else ""
        return warn("oci.conf", f"{path}: {text_problems[0]}{more}",
                    f"see `ocistage runtime oci-conf --check {path}`; a working one: "
                    "`ocistage runtime oci-conf`")
    return ok("oci.conf", f"{path}: no problems for Slurm {version}")


def slurm_conf_location(environ: Mapping[str, str],
                        scontrol_config: str | None) -> tuple[Path | None, str]:
    """The slurm.conf this node's Slurm reads (oci.conf sits beside it) and how it was found:
    ``$SLURM_CONF``, else what ``scontrol show config`` (``scontrol_config``, None when it
    printed nothing) says; never a guess (``/etc/slurm`` may hold another cluster's files
    beside a prefix-built Slurm). None with the reason when neither tells."""
    conf = environ.get("SLURM_CONF")
    if conf:
        return Path(conf), "$SLURM_CONF"
    match = _SLURM_CONF_LINE.search(scontrol_config or "")
    if match is not None:
        return Path(match.group(1)), "scontrol show config"
    said = (scontrol_config or "").strip().splitlines()
    return None, said[-1] if said else "scontrol show config printed nothing"


def check_oci_conf_location(conf: Path | None, how: str) -> Check | None:
    """A warning when doctor cannot read the oci.conf slurmstepd reads on this node: where the
    configuration is not known, or not here (a configless node gets it from slurmctld and
    keeps it in slurmd's cache; a login node may have none); None when it can."""
    if conf is None:
        return warn("oci.conf", f"cannot tell where this Slurm's configuration is: SLURM_CONF "
                                f"is not set and scontrol show config did not say ({how})",
                    "set SLURM_CONF to the cluster's slurm.conf, or run doctor where slurmctld "
                    "answers; oci.conf is read on the compute nodes: check it there with "
                    "`ocistage runtime oci-conf --check PATH`")
    if not conf.parent.is_dir():
        return warn("oci.conf", f"this node has no {conf.parent} (from {how}): configless "
                                "Slurm keeps its files on the compute nodes",
                    "check oci.conf on a compute node: `srun ocistage doctor`, or "
                    "`ocistage runtime oci-conf --check PATH` there")
    return None


# -- a registry -------------------------------------------------------------------------------


def check_registry(host: str, ping: Callable[[], None]) -> Check:
    """``ping`` (the registry client's ``/v2/``) of ``host``: it answers, asks for
    credentials, or cannot be reached (with the client's hint)."""
    from ocistage.bundler.registry.errors import AuthenticationError

    try:
        ping()
    except AuthenticationError as exc:
        return warn("registry", f"{host} answers, but not to us: {exc.message}",
                    exc.hint or "log in", core=True)
    except OcistageError as exc:
        return missing("registry", exc.message, exc.hint, core=True)
    return ok("registry", f"{host} answers its /v2/ API", core=True)


# -- all of them ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DoctorOptions:
    """What to check beyond the host: a stage target other than the configured one, a
    registry (``host[:port]``)."""

    stage_to: str | None = None
    registry: str | None = None


def runtime_checks(uid: int) -> list[Check]:
    runc = command_output(["runc", "--version"])
    crun = command_output(["crun", "--version"])
    controllers = read_text(CGROUP_UNIFIED)
    return [check_runc(runc, uid, crun is not None),
            check_crun(crun, runc is not None, controllers)]


def namespace_checks(uid: int) -> list[Check]:
    sysctl = Path("/proc/sys")
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    try:
        runtime_st = os.stat(runtime_dir) if runtime_dir else None
    except OSError:
        runtime_st = None
    return [check_userns(read_text(sysctl / "kernel/unprivileged_userns_clone"),
                         read_text(sysctl / "user/max_user_namespaces"),
                         read_text(sysctl / "kernel/apparmor_restrict_unprivileged_userns"),
                         uid),
            check_subuid(Path("/etc"), uid, user_name(uid),
                         shutil.which("newuidmap") is not None
                         and shutil.which("newgidmap") is not None),
            check_runtime_dir(runtime_dir, uid, runtime_st)]


def squashfs_checks(uid: int) -> list[Check]:
    try:
        device: os.stat_result | None = os.stat("/dev/fuse")
    except OSError:
        device = None
    facts = FuseFacts(device, os.access("/dev/fuse", os.R_OK | os.W_OK),
                      bool(shutil.which("fusermount3") or shutil.which("fusermount")),
                      read_text(Path("/etc/fuse.conf")))
    mksquashfs = shutil.which("mksquashfs")
    return [check_fuse(facts, uid),
            check_squashfuse(shutil.which("squashfuse"), shutil.which("squashfuse_ll")),
            check_mksquashfs(mksquashfs, command_output(["mksquashfs", "-help"])
                             if mksquashfs else None, shutil.which("unsquashfs"))]


def cache_check(path: Path) -> Check:
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return missing("cache", f"cannot examine {path}: {exc.strerror}",
                       "use a cache of your own (--cache DIR)", core=True)
    place = path if st is not None else existing_ancestor(path)
    return check_cache(path, st, os.access(place, os.W_OK | os.X_OK), free_space(place),
                       None if st is not None else place)


def slurm_checks() -> list[Check]:
    from ocistage.runtimes.errors import SlurmError
    from ocistage.runtimes.oci_conf import lint_oci_conf_file
    from ocistage.runtimes.slurm import installed_version

    try:
        version = installed_version()
    except (SlurmError, OcistageError) as exc:
        return [check_slurm(None, exc.message)]
    checks = [check_slurm(version, None)]
    asked = None if os.environ.get("SLURM_CONF") else command_output(
        ["scontrol", "show", "config"])
    conf, how = slurm_conf_location(os.environ, asked)
    unreadable = check_oci_conf_location(conf, how)
    if unreadable is not None or conf is None:
        return [*checks, *([unreadable] if unreadable else [])]
    path = conf.parent / "oci.conf"
    try:
        problems = ([str(p) for p in lint_oci_conf_file(path, version)]
                    if path.is_file() else None)
    except OcistageError as exc:
        problems = [exc.message]
    checks.append(check_oci_conf(path, problems, version))
    from ocistage.bundler.runtime_state_check import check_runtime_state
    state = check_runtime_state(path, os.geteuid()) if problems is not None else None
    return checks + ([state] if state is not None else [])


def settings_checks(load: Callable[[], Settings],
                    options: DoctorOptions) -> tuple[Settings | None, list[Check]]:
    """The config files, the CA file, the cache and the stage target."""
    try:
        settings: Settings | None = load()
    except OcistageError as exc:
        return None, [check_config(None, exc)]
    assert settings is not None
    checks = [check_config(settings, None)]
    ca = check_ca_file(settings.ca_file, settings.origins.get("ca_file", "ca_file"))
    checks += [ca] if ca is not None else []
    checks.append(cache_check(settings.cache))
    target = options.stage_to or settings.stage_to
    origin = "option --to" if options.stage_to else settings.origins.get("stage_to", "")
    checks.append(check_stage_target(target, origin, judge_stage_dir))
    checks.append(check_image_policy(settings))
    return settings, checks


def check_image_policy(settings: Settings) -> Check:
    """Which image policy every pull obeys (docs/trust.md, "Image trust"), and gpgv when it
    asks for signatures."""
    import shutil

    from ocistage.bundler.trust.files import effective

    try:
        trust = effective(settings.trust_config())
    except OcistageError as exc:
        return missing("image_policy", exc.message, exc.hint, core=True)
    if not trust.found:
        return ok("image_policy", "none: every image is accepted (no policy.json)")
    mandatory = " (mandatory for this site)" if settings.policy_mandatory else ""
    signed = any(requirement.type == "signedBy"
                 for requirements in [trust.policy.default,
                                      *(r for scopes in trust.policy.transports.values()
                                        for r in scopes.values())]
                 for requirement in requirements)
    if signed and shutil.which("gpgv") is None:
        return missing("image_policy", f"{trust.policy.path}{mandatory} asks for signatures, "
                       "but gpgv is not installed: every signed scope rejects",
                       "apt-get install gpgv", core=True)
    return ok("image_policy", f"{trust.policy.path}{mandatory}")


def registry_checks(settings: Settings | None, host: str | None) -> list[Check]:
    """A ping of ``host``, once, without retries (the doctor says how it stands now)."""
    if host is None:
        return []
    if settings is None:
        return [missing("registry", f"{host} not asked: the settings did not load",
                        "fix the config first", core=True)]
    from ocistage.bundler.registry.client import RegistryClient

    config = replace(settings.registry_config(), max_retries=0, deadline=30.0, timeout=15.0)

    def ping() -> None:
        with RegistryClient(host, config) as client:
            client.ping()
    return [check_registry(host, ping)]


def diagnose(load: Callable[[], Settings],
             options: DoctorOptions = DoctorOptions()) -> DoctorReport:
    """Every check of this host for the caller (``load``: the settings, as the other
    commands build them)."""
    uid = os.geteuid()
    settings, checks = settings_checks(load, options)
    checks += registry_checks(settings, options.registry)
    for group in (runtime_checks(uid), namespace_checks(uid), squashfs_checks(uid),
                  slurm_checks()):
        checks += group
    return DoctorReport(user_name(uid), uid, tuple(checks))


def registry_to_check(ref: str | None, registry: str | None) -> str | None:
    """The registry ``doctor REF`` or ``doctor --registry HOST`` asks about, if any."""
    from ocistage.errors import UsageError

    if ref is not None and registry is not None:
        raise UsageError("give REF or --registry, not both",
                         "ocistage doctor REF checks REF's registry")
    if ref is None:
        return registry
    from ocistage.bundler.image.reference import RegistryReference, parse_reference

    source = parse_reference(ref)
    if not isinstance(source, RegistryReference):
        raise UsageError(f"{ref} is a local source, not in a registry",
                         "give a registry reference (registry/repo:tag) or --registry HOST")
    return source.registry
