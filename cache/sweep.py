"""One pass that removes from the cache: ``cache gc`` and ``cache verify``.

A :class:`Sweep` holds what every such pass does the same way, so that the passes themselves
are one short function per area (dead leases, leftovers, orphans, LRU eviction, quarantine):

- it removes, or, in a dry run, does not (:meth:`Sweep.run` is the one place that asks);
- it charges each removal what it frees in the cache's :class:`~ocistage.cache.footprint.Footprint`
  (GC's accounting; a dry run is charged exactly as the real run, so it reports the same sizes);
- it reports: the records (GC's :class:`Removal`, verify's problems) in the order of the removals,
  and what it could not remove and left to whom (:class:`~ocistage.cache.evict.Left`: another
  member's tree in a group-shared cache, evicted by rename only).

:func:`take_out_tree` takes a tree out of the cache (:func:`ocistage.cache.evict.take_out`) in
such a pass: charged and reported when the caller may remove it, left to its owner if not.

An action that raises leaves no record and no charge: a file that is gone by the time it is
removed (``FileNotFoundError``, which the caller suppresses) was removed by someone else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Generic, Literal, TypeVar

from ocistage.cache.evict import Left, may_remove, owner_of, take_out
from ocistage.cache.footprint import Footprint

RemovalKind = Literal["ref", "blob", "bundle", "snapshot", "staged", "lease", "scratch",
                      "partial", "leftover", "quarantine", "usage", "squashfs"]
R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True)
class Removal:
    kind: RemovalKind
    name: str
    size: int          # bytes on disk this frees (inside the cache: as du counts them)
    reason: str


class Sweep(Generic[R]):
    """The removals of one pass over the cache and their records (see the module docstring)."""

    def __init__(self, dry_run: bool, footprint: Footprint | None = None) -> None:
        self.dry_run = dry_run
        self.footprint = footprint
        self.records: list[R] = []
        #: what the pass could not remove, and to whom it is left (:mod:`ocistage.cache.evict`)
        self.left: list[Left] = []

    def leave(self, left: Left) -> Left:
        self.left.append(left)
        return left

    def run(self, action: Callable[[], T], otherwise: Callable[[], object] | None = None
            ) -> T | None:
        """``action()``'s result; in a dry run None, and ``otherwise()`` is called instead
        (to release what the real action would have: a descriptor)."""
        if not self.dry_run:
            return action()
        if otherwise is not None:
            otherwise()
        return None

    def charge(self, paths: Iterable[Path | str]) -> int:
        """Drop the parts at ``paths`` from the footprint; the bytes that frees (0 without
        a footprint, or for paths it does not hold)."""
        if self.footprint is None:
            return 0
        return sum(self.footprint.drop(path) for path in paths)

    def rewritten(self, path: Path, size: int) -> None:
        """Charge the file at ``path`` that the real run rewrote (measured again), or that a
        dry run predicts it writes with ``size`` bytes."""
        if self.footprint is None:
            return
        if self.dry_run:
            self.footprint.predict(path, size)
        else:
            self.footprint.refresh(path)

    def report(self, record: R) -> R:
        self.records.append(record)
        return record

    def remove(self: Sweep[Removal], kind: RemovalKind, name: str, reason: str, *,
               paths: Iterable[Path | str] = (), action: Callable[[], object] | None = None,
               otherwise: Callable[[], object] | None = None, size: int | None = None
               ) -> Removal:
        """Run ``action`` (unless a dry run: ``otherwise``), charge the parts at ``paths`` (or
        count ``size``, for what lies outside the footprint) and report the removal."""
        if action is not None:
            self.run(action, otherwise)
        freed = self.charge(paths) if size is None else size
        return self.report(Removal(kind, name, freed, reason))


def take_out_tree(sweep: Sweep[Removal], kind: RemovalKind, name: str, reason: str,
                  path: Path) -> None:
    """Remove the tree at ``path`` (:func:`ocistage.cache.evict.take_out`): renamed aside
    beside it, then deleted if the caller may (its owner, or root). What stays evicted for its
    owner is left (reported, not charged: its blocks are still on the disk); a dry run
    predicts that by the tree's owner."""
    owner = owner_of(path)
    if owner is None:
        return
    if not may_remove(owner):  # evicted by rename only: nothing freed yet
        sweep.run(partial(take_out, kind, name, path))
        verb = "would be evicted" if sweep.dry_run else "evicted"
        sweep.leave(Left(kind, name, owner, f"{reason}; {verb} by rename, for its owner's "
                         f"next command (or root's `cache gc`) to remove"))
        return
    left = sweep.run(partial(take_out, kind, name, path))
    size = sweep.charge((path,))
    if left is not None:  # ours, but holding what we may not remove: the rest stays
        sweep.leave(Left(left.kind, left.name, left.owner_uid, f"{reason}; {left.reason}"))
        return
    sweep.report(Removal(kind, name, size, reason))
