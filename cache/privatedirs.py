"""Keeping a directory that holds an image's rootfs owner-only (:data:`PRIVATE_DIR_MODE`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ocistage.cache.dirfds import DIR_PATH, chmod_path_fd
from ocistage.cache.dirtrust import owned_by_caller

#: the mode of a directory that holds an image's rootfs (a bundle, a snapshot, a staged
#: version, the stage pool): owner-only, so that no other user of the host can reach the
#: image's setuid/setgid files and file capabilities through it (docs/trust.md)
PRIVATE_DIR_MODE = 0o700


def make_private(path: Path) -> None:
    """Make the caller's directory ``path`` (never a symlink's target) owner-only
    (:data:`PRIVATE_DIR_MODE`) if others may enter it: one made before ocistage kept such
    directories private. Another user's directory is left as it is."""
    fd = os.open(path, DIR_PATH)
    try:
        st = os.fstat(fd)
        if owned_by_caller(st) and stat.S_IMODE(st.st_mode) != PRIVATE_DIR_MODE:
            chmod_path_fd(fd, PRIVATE_DIR_MODE)
    finally:
        os.close(fd)
