"""The caller's own directories: home, config, cache, runtime.

A user's settings, credentials and cache come from that user, whatever ``HOME`` says: a Slurm
daemon started from root's shell passes ``HOME=/root`` to the scrun hooks it runs for every
user, and a job or a sudo'd command may carry another user's ``HOME`` or ``XDG_*`` variables.
A directory named by the environment is used only when it does not exist or belongs to the
caller; otherwise the caller's passwd entry gives the home directory (issue 26). In a user
namespace (rootless Podman runs scrun and its hooks in one, where the user is uid 0) that is
the entry of the id the caller has outside it (:func:`host_id`), not root's.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from pathlib import Path


def host_id(kind: str, ident: int) -> int:
    """``ident`` (a ``"uid"`` or ``"gid"`` of this process's user namespace) as the namespace
    above sees it (``/proc/self/uid_map``); unchanged outside a user namespace or when
    unmapped."""
    try:
        with open(f"/proc/self/{kind}_map", encoding="ascii") as file:
            lines = file.read().splitlines()
    except OSError:
        return ident
    for line in lines:
        fields = line.split()
        if len(fields) != 3 or not all(field.isdigit() for field in fields):
            continue
        inside, outside, count = (int(field) for field in fields)
        if inside <= ident < inside + count:
            return outside + ident - inside
    return ident


def owned_by_caller(path: Path) -> bool:
    """Whether ``path`` is the caller's, or does not exist yet (the caller will make it)."""
    try:
        return os.stat(path).st_uid == os.getuid()
    except FileNotFoundError:
        return True
    except OSError:
        return False


def home_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$HOME`` when it is the caller's, else the caller's home from the passwd database."""
    env = os.environ if environ is None else environ
    named = env.get("HOME")
    if named and os.path.isabs(named) and owned_by_caller(Path(named)):
        return Path(named)
    try:
        return Path(pwd.getpwuid(host_id("uid", os.getuid())).pw_dir)
    except KeyError:  # a uid without a passwd entry (containers): the environment's, if any
        return Path(named) if named else Path("/")


def xdg_dir(variable: str, default: str, environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME``, ``$XDG_CACHE_HOME``, ...: the variable's directory when it is
    absolute and the caller's, else ``default`` below :func:`home_dir`."""
    env = os.environ if environ is None else environ
    named = env.get(variable)
    if named and os.path.isabs(named) and owned_by_caller(Path(named)):
        return Path(named)
    return home_dir(env) / default


def expand_user(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> str:
    """``os.path.expanduser`` whose ``~`` is :func:`home_dir` (``~name`` is name's)."""
    text = os.fspath(path)
    if text == "~" or text.startswith("~/"):
        return str(home_dir(environ)) + text[1:]
    return os.path.expanduser(text)
