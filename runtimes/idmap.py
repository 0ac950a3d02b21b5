"""User-namespace id mappings for rootless bundles.

A rootless bundle maps the caller's host uid/gid to the image user's uid/gid, so the image user
owns every file of the rootfs (which the caller unpacked) and runs with the caller's rights.
runc 1.1 additionally refuses a user namespace in which container uid/gid 0 is unmapped, even
when the process runs as another user. So for an image user other than root, container 0 is
mapped as well, to an id that grants nothing:

- a caller with a subordinate range in ``/etc/subuid``/``/etc/subgid`` (and ``newuidmap`` /
  ``newgidmap`` installed, which runc then uses): the first id of that range;
- root (which may write any mapping): the overflow id 65534 (nobody/nogroup);
- anyone else: nothing can be added; crun and runc >= 1.2 run the bundle, runc 1.1 refuses it
  (use ``--map-root`` there).
"""

from __future__ import annotations

import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path

OVERFLOW_ID = 65534


@dataclass(frozen=True)
class RootPlaceholder:
    """Host ids that container uid/gid 0 map to when the image user is not root."""

    uid: int
    gid: int


def subordinate_start(path: Path, names: tuple[str, ...]) -> int | None:
    """The first id of the first range in ``path`` (subuid/subgid format) for any of ``names``."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.strip().split(":")
        if len(fields) != 3 or fields[0] not in names:
            continue
        try:
            start, count = int(fields[1]), int(fields[2])
        except ValueError:
            continue
        if count > 0:
            return start
    return None


def detect_root_placeholder(uid: int | None = None, gid: int | None = None,
                            etc: Path = Path("/etc")) -> RootPlaceholder | None:
    """What container 0 can map to for this caller (see the module docstring), or None."""
    uid = os.getuid() if uid is None else uid
    gid = os.getgid() if gid is None else gid
    if uid == 0:
        return RootPlaceholder(OVERFLOW_ID, OVERFLOW_ID)
    if shutil.which("newuidmap") is None or shutil.which("newgidmap") is None:
        return None
    try:
        names: tuple[str, ...] = (pwd.getpwuid(uid).pw_name, str(uid))
    except KeyError:
        names = (str(uid),)
    sub_uid = subordinate_start(etc / "subuid", names)
    sub_gid = subordinate_start(etc / "subgid", names)
    if sub_uid is None or sub_gid is None:
        return None
    return RootPlaceholder(sub_uid, sub_gid)


def mappings(container_id: int, host_id: int, placeholder: int | None) -> list[dict[str, int]]:
    """uid (or gid) mappings: the image id to the caller, plus container 0 when needed."""
    result = [{"containerID": container_id, "hostID": host_id, "size": 1}]
    if container_id != 0 and placeholder is not None and placeholder != host_id:
        result.append({"containerID": 0, "hostID": placeholder, "size": 1})
    return result
