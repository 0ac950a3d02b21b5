"""A copy of this checkout's files (tracked and new, not ignored), for tests that build from it
without leaving anything in the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def checkout_copy(dest: Path) -> Path:
    """The files git lists in this checkout (as they are in the work tree) copied to ``dest``,
    links as links; returns ``dest``."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        origin, copy = REPO / name, dest / name
        if not origin.exists() and not origin.is_symlink():
            continue  # deleted in the work tree
        copy.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_symlink():
            copy.symlink_to(os.readlink(origin))
        else:
            shutil.copy2(origin, copy)
    return dest
