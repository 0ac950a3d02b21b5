"""``unstage``: remove a staged bundle safely and drop its lease.

Only a directory carrying an ocistage marker (``.ocistage-staged.json``) is removed. The path's
last component is opened with ``O_NOFOLLOW`` (the target holding it may be reached through a
symlink the user chose, as with ``stage --to``): a symlink there is refused, never followed, and
the removal itself works through directory descriptors (:mod:`ocistage.cache.treeremoval`), so a
symlink swapped in at any level while it runs cannot redirect it outside the bundle. A squashfs
mount is unmounted first and its image (named in the marker, beside the path) removed.

Leases: with a ``holder`` (the CLI passes the Slurm job inside a job, or ``--pin``), only that
holder's leases on the path are released, and the bundle is kept while another live lease still
uses it (another job sharing the same copy); ``force`` removes it anyway. Without a holder, every
lease on the path is released. Pool entries no other bundle links to any more are removed.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.cache import leases, reserve, targetlayout
from ocistage.cache.dirfds import DIR_FOLLOW, DIR_READ
from ocistage.cache.errors import StoreError
from ocistage.cache.leases import Holder, Lease, StagedPlace
from ocistage.stagers import retired
from ocistage.stagers.errors import StageError
from ocistage.stagers.markers import (
    Marker,
    is_node_local,
    live_leases,
    marker_of,
    release_leases,
    same_holder,
    staged_leases,
    write_at,
)

if TYPE_CHECKING:
    from ocistage.results import Renderer


def _release_leases(cache_root: Path, path: Path, holder: Holder | None) -> list[Lease]:
    """Release this holder's (or every) lease on ``path``; returns the live leases left."""
    return live_leases(release_leases(cache_root, path, holder))


def _hand_over(parent_fd: int, name: str, fd: int, marker: Marker, mounted: bool,
               live: list[Lease]) -> None:
    """Make the marker name a lease that stays, if the one it named was just released.

    ``cache gc`` removes a staged bundle only when its marker names one of its dead leases;
    a marker naming a released lease would keep the bundle forever once the remaining
    holders are gone. A mounted image is read-only: its outer marker is written instead.
    """
    if marker.id in {lease.id for lease in live}:
        return
    data = replace(marker, id=live[0].id).to_json()
    if mounted:
        write_at(parent_fd, targetlayout.outer_marker_name(name), data)
    else:
        write_at(fd, targetlayout.MARKER_NAME, data)


@dataclass(frozen=True)
class Unstaged:
    """What ``ocistage unstage`` reports: the path it was given, and :func:`unstage`'s answer."""

    path: Path
    removed: bool
    absent: bool = False  # nothing was there: only a lease on it was released, if ``leased``
    leased: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path.absolute()), "removed": self.removed}

    def render(self, out: Renderer) -> None:
        if self.removed:
            out.note(f"removed {self.path}")
        elif self.absent and self.leased:
            out.note(f"released the lease on {self.path} (already removed)")
        elif self.absent:
            out.note(f"nothing was staged at {self.path}")
        else:
            out.note(f"kept {self.path}: other jobs or pins still hold it (--force removes it)")


def holds_lease(cache_root: Path, path: Path, holder: Holder | None) -> bool:
    """Whether ``holder`` (anybody, if None) holds a lease on staged ``path``."""
    return any(holder is None or same_holder(lease.holder, holder)
               for lease in staged_leases(cache_root, Path(os.path.abspath(path))))


def unstage(path: Path, *, cache_root: Path, holder: Holder | None = None,
            force: bool = False) -> bool:
    """Remove the staged bundle at ``path``; True if it was removed, False if it was absent or
    is kept for another live lease (see the module docstring)."""
    path = Path(os.path.abspath(path))
    parent, name = os.path.split(path)
    try:
        parent_fd = os.open(parent, DIR_FOLLOW)  # the target, reached as the user spells it
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            _release_leases(cache_root, path, holder)
            return False
        raise StageError(f"cannot open {parent}: {exc.strerror}") from exc
    try:
        with reserve.spent(cache_root):  # room for the removal's lease on a full filesystem
            removed = _unstage_in(parent_fd, Path(parent), name, path, cache_root, holder,
                                  force)
        # versions of it that a re-stage retired while jobs ran on them (ocistage.stagers.retired)
        retired.sweep(Path(parent), name, cache_root, holder=holder, release=True, force=force)
    except OSError as exc:
        raise StageError(f"removing {path} failed: {exc.strerror} ({exc.filename})",
                         "check that you own the staged bundle") from exc
    finally:
        os.close(parent_fd)
    return removed


def _unstage_in(parent_fd: int, parent: Path, name: str, path: Path, cache_root: Path,
                holder: Holder | None, force: bool) -> bool:
    bundle = _open_bundle(parent_fd, parent, name, path)
    if bundle is None:
        _release_leases(cache_root, path, holder)
        return False
    try:
        if not bundle.remnant and not force and _hand_over_to_others(cache_root, path,
                                                                     holder, bundle):
            os.close(bundle.fd)
            return False
        # held by this process until the bundle is gone, and named in the outer marker
        # before anything is removed: an unstage killed half-way leaves a bundle (or what an
        # unmount left of it) that the next unstage, or GC once this process is gone, finish
        removal = _removal_lease(cache_root, path)
        targetlayout.mark_removing(bundle, removal)
    except BaseException:
        if bundle.fd >= 0:
            os.close(bundle.fd)
        raise
    outer = bundle.outer
    earlier = outer.get("id") if outer is not None and targetlayout.removing(outer) else None
    release_leases(cache_root, path, holder, keep=removal)
    targetlayout.take_down(bundle)   # closes fd
    targetlayout.remove_beside(bundle)
    for lease_id in (earlier, removal):  # the removal lease of an unstage cut short too
        if isinstance(lease_id, str):
            leases.release(cache_root, lease_id)
    return True


def _removal_lease(cache_root: Path, path: Path) -> str:
    """The id of this process's lease on ``path`` while it removes it; a node-local copy's
    records the node, so that another node's unstage of its own copy at the same path does
    not take it for a holder of that one. Where the cache is not there and cannot be made
    (not visible on this node: a job's cleanup on a node without it), no lease of that cache
    can hold the copy either: an id that no lease file has."""
    place = StagedPlace.of(path, local=is_node_local(cache_root, path))
    try:
        return place.acquire(cache_root, Holder.this_process()).id
    except StoreError:
        if cache_root.is_dir():
            raise
        return uuid.uuid4().hex


def _open_bundle(parent_fd: int, parent: Path, name: str,
                 path: Path) -> targetlayout.StagedBundle | None:
    """The staged bundle ``name`` of ``parent_fd``, opened, or the remnant of a removal cut
    short (:func:`ocistage.cache.targetlayout.remnant_of`); None if there is neither."""
    try:
        fd = os.open(name, DIR_READ, dir_fd=parent_fd)
    except FileNotFoundError:
        fd = -1
    except OSError as exc:
        raise StageError(f"{path} is not a staged bundle (not a directory, or a symlink)",
                         "give the path ocistage stage printed") from exc
    try:
        document = targetlayout.read_json_at(fd, targetlayout.MARKER_NAME) if fd >= 0 else None
        if document is not None and marker_of(document) is not None:
            mounted = os.fstat(fd).st_dev != os.fstat(parent_fd).st_dev
            outer = targetlayout.read_json_at(parent_fd, targetlayout.outer_marker_name(name))
            return targetlayout.StagedBundle(parent_fd, parent, name, fd, document, outer, mounted)
        remnant = targetlayout.remnant_of(parent_fd, parent, name, fd)
        if remnant is None and fd >= 0:
            raise StageError(f"{path} was not staged by ocistage (no marker); not removing it",
                             "remove it yourself if it is yours")
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return remnant


def _hand_over_to_others(cache_root: Path, path: Path, holder: Holder | None,
                         bundle: targetlayout.StagedBundle) -> bool:
    """Release ``holder``'s leases and keep the bundle if another live lease still uses it
    (:func:`_hand_over`): True then; False (nothing released) when it is to be removed."""
    others = [lease for lease in staged_leases(cache_root, path)
              if holder is not None and not same_holder(lease.holder, holder)]
    live = live_leases(others)
    if not live:
        return False
    release_leases(cache_root, path, holder)
    marker = marker_of(bundle.marker)
    assert marker is not None
    _hand_over(bundle.parent_fd, bundle.name, bundle.fd, marker, bundle.mounted, live)
    return True
