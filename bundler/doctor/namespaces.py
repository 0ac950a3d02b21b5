"""The doctor's checks of what rootless containers need from the kernel and the host: user
namespaces, the caller's subordinate id ranges, ``$XDG_RUNTIME_DIR``."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from ocistage.bundler.doctor.probes import read_text, user_name
from ocistage.bundler.doctor.report import Check, missing, ok, warn


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
