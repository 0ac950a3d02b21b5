"""Reading back a file of the test's own whatever its mode, as root and as a user.

Root reads a mode-000 file; its owner, when not root, cannot until it gives itself the read
bit. Tests that check what a file holds (beside its mode, checked first) read it this way, so
they check the same thing for both callers and leave the mode as it was.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def read_own_bytes(path: Path) -> bytes:
    """The contents of path, a regular file the caller owns, with its mode restored after."""
    try:
        return path.read_bytes()
    except PermissionError:
        mode = stat.S_IMODE(path.lstat().st_mode)
        path.chmod(mode | stat.S_IRUSR)
        try:
            return path.read_bytes()
        finally:
            os.chmod(path, mode)
