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


def id_map(kind: str) -> list[tuple[int, int, int]]:
    """This process's user namespace's ``/proc/self/{uid,gid}_map``: (inside, outside, count)
    ranges; the identity map when it cannot be read."""
    try:
        with open(f"/proc/self/{kind}_map", encoding="ascii") as file:
            lines = file.read().splitlines()
    except OSError:
        return [(0, 0, 1 << 32)]
    ranges = []
    for line in lines:
        fields = line.split()
        if len(fields) == 3 and all(field.isdigit() for field in fields):
            inside, outside, count = (int(field) for field in fields)
            ranges.append((inside, outside, count))
    return ranges


def host_id(kind: str, ident: int) -> int:
    """``ident`` (a ``"uid"`` or ``"gid"`` of this process's user namespace) as the namespace
    above sees it; unchanged outside a user namespace or when unmapped."""
    for inside, outside, count in id_map(kind):
        if inside <= ident < inside + count:
            return outside + ident - inside
    return ident


def host_root_mapped() -> bool:
    """Whether the host's root is a user here: not so in an unprivileged user namespace
    (rootless Podman's), where root's files show as the overflow user (nobody), like any
    other user's that is not mapped, so who owns a directory cannot be told."""
    return any(outside <= 0 < outside + count for _, outside, count in id_map("uid"))


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
