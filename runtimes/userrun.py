"""What running a rootless bundle as a user other than root needs on this host, said when the
bundle is made (``ocistage bundle``) rather than by the runtime later.

Two known limits, both measured with Debian 12's runc 1.1.5 as an unprivileged user
(docs/runtime-config.md, "Running a bundle as a user"):

- runc before 1.2 refuses a user namespace in which container uid 0 is not mapped, and only
  root may map an id other than its own (a subordinate id through ``newuidmap`` does not help:
  runc then ``fchown``s its stdio pipes to that id). A bundle whose process runs as an image
  user other than root (``uid_map`` of the caller to, say, 1000) fails with ``User namespaces
  enabled, but no user mapping found.`` or ``fchown fd 7: operation not permitted``. Fixes:
  ``bundle --map-root`` (the caller is container root), or crun, or runc 1.2 and later.
- runc and crun keep their state in ``$XDG_RUNTIME_DIR/runc`` (``/crun``), else under
  ``/run``, which only root may write: ``runc run`` fails with ``mkdir /run/runc: permission
  denied`` (``lstat /run/runc/NAME`` where ``/run/runc`` exists) when ``XDG_RUNTIME_DIR`` is
  unset, as after ``su`` or in a batch job without a login session, or names a directory the
  user may not write. Fix: ``--root DIR`` of the user's.

:func:`user_run_notices` gives one :class:`ocistage.cache.notice.Notice` (kind ``runtime``)
per limit a bundle's config meets here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ocistage.cache.notice import Kind, Notice

#: the first runc release that runs a user namespace without container uid 0 mapped
RUNC_WITHOUT_ROOT_MAPPING = (1, 2)
#: what the notices suggest for ``--root``: a directory of the user's (the runtime makes it)
USER_STATE_DIR = '"$HOME/.local/state/{runtime}"'
_VERSION = re.compile(r"^runc version (\d+)\.(\d+)(?:\.(\d+))?", re.MULTILINE)


def runc_version(binary: str | None = None) -> tuple[int, ...] | None:
    """The version of ``binary`` (default: ``runc`` on PATH), None when there is none or it
    does not say (``runc --version``: ``runc version 1.1.5+ds1``)."""
    path = binary or shutil.which("runc")
    if path is None:
        return None
    try:
        result = subprocess.run([path, "--version"], capture_output=True, text=True,
                                timeout=10, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    found = _VERSION.search(result.stdout)
    if result.returncode != 0 or found is None:
        return None
    return tuple(int(part) for part in found.groups() if part is not None)


def user_run_notices(config: Mapping[str, Any], bundle: Path, *, uid: int | None = None,
                     environ: Mapping[str, str] | None = None,
                     find_runc: Callable[[], tuple[int, ...] | None] = runc_version,
                     ) -> tuple[Notice, ...]:
    """What keeps user ``uid`` (default: this process's) from running the rootless bundle at
    ``bundle`` with runtime config ``config`` here (see the module docstring); nothing for root
    or a config without a user namespace. ``find_runc`` is asked only when it matters."""
    uid = os.getuid() if uid is None else uid
    if uid == 0 or not _user_namespace(config):
        return ()
    notices = []
    process_uid = _process_uid(config)
    if process_uid != 0:
        version = find_runc()
        if version is not None and version < RUNC_WITHOUT_ROOT_MAPPING:
            notices.append(_runc_mapping_notice(version, process_uid))
    runtime_dir = (os.environ if environ is None else environ).get("XDG_RUNTIME_DIR", "")
    if not _writable_dir(runtime_dir):
        notices.append(_state_dir_notice(runtime_dir, bundle))
    return tuple(notices)


def slurm_run_notices(config: Mapping[str, Any], *, uid: int | None = None,
                      find_runc: Callable[[], tuple[int, ...] | None] = runc_version,
                      ) -> tuple[Notice, ...]:
    """What keeps Slurm from running the rootless bundle of ``config`` for user ``uid``
    (default: this process's) with the runc found here (``ocistage submit``; the nodes'
    oci.conf names theirs, usually the same package): the check of :func:`user_run_notices`
    that does not depend on this shell (oci.conf gives runc its ``--root``), said with the
    option of ``submit``."""
    uid = os.getuid() if uid is None else uid
    if uid == 0 or not _user_namespace(config):
        return ()
    process_uid = _process_uid(config)
    if process_uid == 0:
        return ()
    version = find_runc()
    if version is None or version >= RUNC_WITHOUT_ROOT_MAPPING:
        return ()
    return (_runc_mapping_notice(version, process_uid, "submit"),)


def user_run_command(bundle: Path, runtime: str = "runc") -> str:
    """The command line that runs ``bundle`` as a user without a usable XDG_RUNTIME_DIR."""
    return (f"{runtime} --root {USER_STATE_DIR.format(runtime=runtime)} run -b "
            f"{shlex.quote(str(bundle))} NAME")


def _user_namespace(config: Mapping[str, Any]) -> bool:
    linux = config.get("linux")
    namespaces = linux.get("namespaces") if isinstance(linux, Mapping) else None
    return isinstance(namespaces, list) and any(
        isinstance(ns, Mapping) and ns.get("type") == "user" for ns in namespaces)


def _process_uid(config: Mapping[str, Any]) -> int:
    process = config.get("process")
    user = process.get("user") if isinstance(process, Mapping) else None
    uid = user.get("uid", 0) if isinstance(user, Mapping) else 0
    return uid if isinstance(uid, int) else 0


def _writable_dir(path: str) -> bool:
    return bool(path) and os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def _runc_mapping_notice(version: tuple[int, ...], process_uid: int,
                         command: str = "bundle") -> Notice:
    shown = ".".join(map(str, version))
    fix = ("make the bundle with --map-root" if command == "bundle" else
           f"{command} with --map-root")
    return Notice(Kind.RUNTIME, (
        f"runc {shown} (on PATH) cannot run this bundle as you: its process runs as the image "
        f"user (uid {process_uid}) in a user namespace, and runc before 1.2 also needs "
        "container uid 0 mapped, which only root may map (runc says 'User namespaces "
        "enabled, but no user mapping found.' or 'fchown fd 7: operation not permitted'); "
        f"{fix} (you run as root in the container, which is you outside), or run it with "
        "crun"))


def _state_dir_notice(runtime_dir: str, bundle: Path) -> Notice:
    why = ("XDG_RUNTIME_DIR is not set" if not runtime_dir else
           f"XDG_RUNTIME_DIR ({runtime_dir}) is not a directory you may write")
    return Notice(Kind.RUNTIME, (
        f"{why}: runc and crun would keep their state under /run, which only root may write "
        f"(runc says 'mkdir /run/runc: permission denied'); give them a directory of yours "
        f"with --root: {user_run_command(bundle)}"))
