"""Taking a tree out of the cache, whoever made it (docs/cache.md, "A member's gc").

In a group-shared cache every member can rename and unlink the entries of the cache's
directories (they are group-writable, not sticky), but not empty another member's tree: its
inner directories keep the image's modes (0755, 0700) and belong to their maker. A removal that
got halfway used to leave a half-removed tree of one member in the private scratch directory of
another, and every later command of both failed on it. So a tree is taken out in two steps:

1. **evicted**: renamed, in the directory that holds it, to ``.evicted-<name>-<random>``
   (:func:`evict`). One ``rename()`` in the same directory needs only write access to that
   directory, never to the tree, and the tree is no longer at its path: nothing reads it as a
   bundle, snapshot or quarantined entry any more;
2. **removed** (:func:`remove_evicted`) through descriptors, never following a link, by
   whoever may remove it whole: root, or the owner of the tree's top. A member who may not
   leaves it evicted and says to whom (:class:`Left`); its owner's next command
   (:meth:`ocistage.cache.store.Store.clean_leftovers`, run by every command that opens the
   cache) and root's ``cache gc`` remove it. A removal that fails halfway leaves the rest
   under its evicted name, never in a directory of the remover.

Root is the site admin's exception: in the cache it removes any tree (mount points still stop
the removal, links are still never followed).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ocistage.cache.dirfds import open_parent
from ocistage.cache.dirtrust import user_name
from ocistage.cache.errors import StoreError
from ocistage.cache.treeremoval import remove_at

#: the prefix of a tree taken out of its place, removed by its owner or root
EVICTED_PREFIX = ".evicted-"


@dataclass(frozen=True)
class Left:
    """What a pass took out of its place (or found there) but could not remove: whose it is
    and why it stays."""

    kind: str        # what it was: bundle, snapshot, quarantine, scratch
    name: str
    owner_uid: int
    reason: str

    @property
    def owner(self) -> str:
        return user_name(self.owner_uid)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "owner_uid": self.owner_uid,
                "owner": self.owner, "reason": self.reason}

    def describe(self, dry_run: bool = False) -> str:
        verb = "would leave" if dry_run else "left"
        return f"{verb} {self.kind} {self.name} to {self.owner}: {self.reason}"


def may_remove(uid: int) -> bool:
    """Whether the caller may remove a tree of the cache whose top belongs to ``uid``."""
    caller = os.geteuid()
    return caller == 0 or uid == caller


def is_evicted(name: str) -> bool:
    return name.startswith(EVICTED_PREFIX)


def evicted_name(name: str) -> str:
    return f"{EVICTED_PREFIX}{name}-{os.urandom(4).hex()}"


def evict(path: Path) -> Path | None:
    """Rename ``path`` to an evicted name beside it (one ``rename()``); where it went, or
    None if it is gone. Raises OSError as ``rename`` does (a directory nobody may write)."""
    doomed = path.parent / evicted_name(path.name)
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return None
    return doomed


def owner_of(path: Path) -> int | None:
    """The uid owning ``path`` (never followed), or None if it is gone."""
    try:
        return os.lstat(path).st_uid
    except FileNotFoundError:
        return None


def remove_evicted(path: Path) -> str | None:
    """Remove the tree at ``path`` (evicted: at a name nobody reads) if the caller may;
    None once it is gone, else why it stays."""
    owner = owner_of(path)
    if owner is None:
        return None
    if not may_remove(owner):
        return "only its owner (or root) can empty it; their next command removes it"
    try:
        remove_in_cache(path)
    except (OSError, StoreError) as exc:
        return f"its removal stopped halfway ({exc}); its owner or root removes the rest"
    return None


def remove_in_cache(path: Path) -> None:
    """Remove the tree at ``path`` in the cache through descriptors, never following a link:
    root whole, whoever made its entries (the site admin's exception: the members' trees of
    a group-shared cache are its content); anybody else as :func:`remove_at` does (another
    user's entry where others can write is left and raises
    :class:`~ocistage.cache.errors.UntrustedPath`). Missing is fine."""
    try:
        parent_fd, name = open_parent(path)
    except FileNotFoundError:
        return
    try:
        remove_at(parent_fd, name, own_tree=os.geteuid() == 0)
    finally:
        os.close(parent_fd)


def take_out(kind: str, name: str, path: Path) -> Left | None:
    """:func:`evict` ``path`` and :func:`remove_evicted` it: None once it is gone, else what
    stays evicted and to whom."""
    owner = owner_of(path)
    if owner is None:
        return None
    try:
        doomed = evict(path)
    except OSError as exc:
        return Left(kind, name, owner, f"cannot move it aside: {exc.strerror}")
    if doomed is None:
        return None
    why = remove_evicted(doomed)
    if why is None:
        return None
    return Left(kind, name, owner_of(doomed) or owner, f"evicted to {doomed.name}; {why}")


def evicted_in(directory: Path) -> list[Path]:
    """The evicted trees in ``directory``."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(
            directory) as entries:
        return sorted(Path(e.path) for e in entries if is_evicted(e.name))
    return []
