"""Which mounts of a bundle's ``config.json`` need a mount point in the rootfs itself, and of
which kind.

The one rule for :mod:`ocistage.bundler.rootfsmounts` (made in a rootfs being built)
and :mod:`ocistage.stagers.squashfs` (added to a read-only image).

A mount whose destination lies below an earlier mount's is made by the runtime inside that
mount (``/dev/pts`` in ``/dev``'s tmpfs), not in the rootfs; every other one needs its
destination in the rootfs: a directory for a filesystem (``proc``, ``tmpfs``, ``mqueue``, ...)
or a bind of a directory, an empty file for a bind of a file. What a bind whose source this host
does not have needs is not known here (``kind`` None): the node that runs the bundle may have it
as either. Destinations are taken lexically (empty and ``.`` components dropped); one with a
``..`` component is left to the runtime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["d", "f"]


@dataclass(frozen=True)
class MountPoint:
    parts: tuple[str, ...]  # the destination's components, below the rootfs
    kind: Kind | None       # "d" directory, "f" file, None: a bind of a source missing here

    @property
    def path(self) -> str:
        return "/".join(self.parts)


def mount_points(mounts: Sequence[Mapping[str, Any]]) -> list[MountPoint]:
    """The mount points ``mounts`` (a runtime config's, in order) need in the rootfs."""
    wanted: list[MountPoint] = []
    earlier: list[tuple[str, ...]] = []
    for mount in mounts:
        parts = tuple(p for p in str(mount.get("destination", "")).split("/")
                      if p not in ("", "."))
        if not parts or ".." in parts:
            continue
        below = any(parts[:len(outer)] == outer for outer in earlier)
        earlier.append(parts)
        if below:
            continue
        wanted.append(MountPoint(parts, _kind(mount)))
    return wanted


def _kind(mount: Mapping[str, Any]) -> Kind | None:
    if mount.get("type") != "bind":
        return "d"
    source = mount.get("source")
    if not isinstance(source, str) or not os.path.isabs(source):
        return None
    if os.path.isdir(source):
        return "d"
    return "f" if os.path.exists(source) else None
