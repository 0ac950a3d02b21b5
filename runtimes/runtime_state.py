"""Where a container runtime keeps its state under slurmstepd, and whether that works for a job.

``runc``/``crun``/``nvidia-container-runtime`` keep each container's state in ``--root``.
slurmstepd runs the ``RunTime*`` commands as the job user on the compute node, where that user
usually has no login session: ``/run/user/UID`` (systemd-logind's, made at login) is missing
there and ``runc run`` fails (``mkdir /run/user/1004: permission denied``). A fixed name under
a directory every user can write (``/tmp/runc-%u``) is no better: a co-tenant can make it
first and then owns the runtime's state.

The generated oci.conf keeps the state in the step's own spool directory, which slurmstepd
makes for each step, owned by the job user, under ``SlurmdSpoolDir`` (root's): ``%m`` from
23.02 on; Slurm 22.05 has no ``%m``, but always writes the step's ``config.json`` into that
directory (``SlurmdSpoolDir/oci-jobJJJJJ-SSSSS/``) and makes ``%b`` name it. runc removes a
container's state when ``run`` returns, so slurmstepd's cleanup can remove the directory.

slurmstepd makes the spool directories mode 0770 (group: the job user's primary group) and
accepts one that exists already, whoever made it (container.c ``_mkdir``): the state is the
job user's alone where the primary group is private and ``ContainerPath`` (the spool
directories' pattern) is not in a directory others can write.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ocistage.runtimes.slurm import SlurmVersion

#: the keys whose commands take the runtime's ``--root``
_ROOT_KEYS = ("RunTimeRun", "RunTimeCreate", "RunTimeStart", "RunTimeQuery", "RunTimeKill",
              "RunTimeDelete")
_ROOT_OPTION = re.compile(r"(?:^|\s)--root(?:=|\s+)(\S+)")
#: directories every user may write by convention (a fixed name there can be made first)
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
#: what the spool directory is called in a RunTime pattern, by release
SPOOL_TOKEN_22_05 = "%b"
SPOOL_TOKEN = "%m"
LOGIN_SESSION_PREFIX = "/run/user/"
NO_SESSION = ("exists only while the user has a login session on the node; job users "
              "usually have none there, and `runc run` fails "
              "(mkdir /run/user/UID: permission denied)")
STATE_HINT = ("generate oci.conf again (`ocistage runtime oci-conf`: the state goes to the "
              "step's spool directory, %m), or give --root a directory each user owns alone")


def spool_root(version: SlurmVersion) -> str:
    """The pattern of the step's spool directory in a ``RunTime*`` command on ``version``."""
    return SPOOL_TOKEN_22_05 if version < SlurmVersion(23, 2) else SPOOL_TOKEN


def runtime_root(entries: dict[str, tuple[int, str]]) -> tuple[int, str] | None:
    """(line, value) of the first ``--root`` in the runtime commands, or None (no ``--root``:
    the runtime's default, ``$XDG_RUNTIME_DIR`` for a user)."""
    for key in _ROOT_KEYS:
        entry = entries.get(key)
        if entry is None:
            continue
        match = _ROOT_OPTION.search(entry[1])
        if match is not None:
            return entry[0], match.group(1)
    return None


def fixed_prefix(pattern: str) -> str:
    """The part of ``pattern`` before its first token or shell expansion (``%`` or ``$``)."""
    return re.split(r"[%$]", pattern, maxsplit=1)[0]


def in_spool_dir(root: str) -> bool:
    return root.startswith((SPOOL_TOKEN, SPOOL_TOKEN_22_05))


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


def shared_dir_of(pattern: str) -> str | None:
    """The world-writable directory (:data:`SHARED_DIRS`) in which ``pattern`` names an entry
    per user or job (its first component there holds a token or expansion, or is empty: the
    shared directory itself): one a co-tenant can make first. A fixed name there
    (``/tmp/site/%u``) depends on who made it: :func:`made_first_by_others` asks the host."""
    for directory in SHARED_DIRS:
        if pattern.rstrip("/") == directory:
            return directory
        if pattern.startswith(directory + "/"):
            first = pattern[len(directory) + 1:].split("/", 1)[0]
            if not first or "%" in first or "$" in first:
                return directory
    return None


def made_first_by_others(pattern: str) -> Path | None:
    """The existing directory on this host in which a co-tenant could make a directory of
    ``pattern`` before the runtime or slurmstepd does (writable by others than its owner and
    root, the owner not root), or None."""
    prefix = Path(fixed_prefix(pattern) or "/")
    place = prefix
    while True:
        try:
            st = os.lstat(place)
            break
        except OSError:
            if place == place.parent:
                return None
            place = place.parent
    if place == prefix and "%" not in pattern and "$" not in pattern:
        return None  # nothing left to make
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o002:
        return place
    return None


def root_problems(entries: dict[str, tuple[int, str]]) -> list[tuple[int, str]]:
    """(line, message) for a runtime root that fails for a job user or that a co-tenant can
    make first; what ``oci-conf --check`` reports (text only: nothing on this host is asked)."""
    found = runtime_root(entries)
    if found is None:
        return []
    number, root = found
    if root.startswith(LOGIN_SESSION_PREFIX):
        return [(number, f"runtime state in {root}: /run/user/UID {NO_SESSION}; "
                         f"{STATE_HINT}")]
    if in_spool_dir(root):
        container_path = entries.get("ContainerPath")
        shared = shared_dir_of(container_path[1]) if container_path else None
        if container_path is not None and shared is not None:
            return [(container_path[0], f"ContainerPath {container_path[1]} names a "
                                        f"directory per job in {shared}, which every user "
                                        "can write: a co-tenant can make a job's spool "
                                        "directory (and the runtime state in it) first; "
                                        "slurmstepd accepts it")]
        return []
    shared = shared_dir_of(root)
    if shared is not None:
        return [(number, f"runtime state in {root}: a directory per user or job in {shared}, "
                         "which every user can write: a co-tenant can make it first; "
                         f"{STATE_HINT}")]
    return []


# -- for the caller (doctor) ---------------------------------------------------------------------


@dataclass(frozen=True)
class StateFinding:
    """How the runtime state stands for the caller: fine (``fix`` None) or not."""

    detail: str
    fix: str | None = None


def group_shared_with(gid: int, uid: int) -> list[str]:
    """Other users whose primary group is ``gid`` or who are listed in it."""
    others = set(_members(gid))
    others.update(entry.pw_name for entry in _passwd() if entry.pw_gid == gid
                  and entry.pw_uid != uid)
    try:
        own = pwd.getpwuid(uid).pw_name
    except KeyError:
        own = ""
    others.discard(own)
    return sorted(others)


def _members(gid: int) -> list[str]:
    try:
        return list(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return []


def _passwd() -> list[pwd.struct_passwd]:
    try:
        return pwd.getpwall()
    except OSError:
        return []


def judge_root(root: str, uid: int, gid: int, *, others_in_group: list[str],
               container_path: str | None, run_user: os.stat_result | None) -> StateFinding:
    """The runtime root ``root`` (a pattern) for the caller ``uid``: ``others_in_group`` share
    its primary group ``gid``; ``run_user`` is the stat of its ``/run/user/UID`` here."""
    if root.startswith(LOGIN_SESSION_PREFIX):
        here = ("it exists here (your login session)" if run_user is not None
                else "you have none here")
        return StateFinding(f"{root}: /run/user/UID {NO_SESSION}; {here}", STATE_HINT)
    if in_spool_dir(root):
        if uid != 0 and others_in_group:
            shown = ", ".join(others_in_group[:3]) + (" ..." if len(others_in_group) > 3 else "")
            return StateFinding(
                f"{root}: the step's spool directory, which slurmstepd makes mode 0770 for "
                f"your primary group {gid}, shared with {shown}: they can change your "
                "containers' state",
                "give each user a private primary group (Debian's default), or --root a "
                "directory you own alone")
        shared = (shared_dir_of(container_path) or str(made_first_by_others(container_path)
                                                        or "") or None
                  if container_path else None)
        if shared is not None:
            return StateFinding(f"ContainerPath {container_path} is in {shared}: a co-tenant "
                                "can make your job's spool directory first",
                                "set ContainerPath under SlurmdSpoolDir (the default)")
        return StateFinding(f"{root}: the step's spool directory (made by slurmstepd for "
                            "each step, yours alone)")
    shared = shared_dir_of(root)
    open_dir = str(made_first_by_others(root) or "") or shared
    if open_dir:
        return StateFinding(f"{root}: made in {open_dir}, which every user can write: a "
                            "co-tenant can make it first", STATE_HINT)
    return StateFinding(f"{root}: a directory the site chose")


def judge_oci_conf_root(entries: dict[str, tuple[int, str]], uid: int) -> StateFinding | None:
    """:func:`judge_root` for the root in ``entries`` and the calling user, or None when the
    runtime takes no ``--root`` (apptainer, enroot)."""
    found = runtime_root(entries)
    if found is None:
        return None
    gid = os.getegid() if uid == os.geteuid() else _primary_gid(uid)
    run_user: os.stat_result | None
    try:
        run_user = os.stat(Path(LOGIN_SESSION_PREFIX) / str(uid))
    except OSError:
        run_user = None
    if run_user is not None and not stat.S_ISDIR(run_user.st_mode):
        run_user = None
    container_path = entries.get("ContainerPath")
    return judge_root(found[1], uid, gid, others_in_group=group_shared_with(gid, uid),
                      container_path=container_path[1] if container_path else None,
                      run_user=run_user)


def _primary_gid(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return os.getegid()
