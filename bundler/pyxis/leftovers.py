"""What importers of this user killed on this host (SIGKILL: no handler ran) left in a store,
dropped by the user's next importer command: their leases, scratch directories and build locks.

Only what the caller owns: another user's leftovers in a group-shared store stay for that
user's next command, or the store's ``cache gc``. A store that does not exist is not made.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ocistage.cache.errors import StoreError
from ocistage.cache.leases import drop_own_dead
from ocistage.cache.locks import FileLock
from ocistage.cache.pyxisimages import dead_build_locks


def drop_leftovers(root: Path) -> None:
    """Drop what this user's killed importers left in the store at ``root``; never fails
    (a store the caller cannot write, or does not trust, is left alone)."""
    if not root.is_dir():
        return
    from ocistage.cache.store import Store

    with contextlib.suppress(OSError, StoreError):
        drop_own_dead(root)
        for lock in dead_build_locks(root):
            if os.lstat(lock).st_uid == os.geteuid():
                held = FileLock(lock)
                if held.try_acquire():  # breaks the dead owner's lock, then drops it
                    held.release()
        if os.access(root, os.W_OK):
            Store.open(root)  # removes this user's dead scratch directories (tmp/)
