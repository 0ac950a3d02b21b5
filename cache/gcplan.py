"""What GC keeps and what eviction takes.

The cache as one GC sees it (:class:`Plan`), what stays live (leases, kept refs and what they
reach), and the least recently used chosen for eviction (:func:`choose_evictions`) until the
cache fits its budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ocistage.cache import usage
from ocistage.cache.digest import Digest
from ocistage.cache.evict import may_remove, owner_of
from ocistage.cache.footprint import Footprint
from ocistage.cache.inventory import Blob, Bundle, Ref, bundle_last_used, ref_last_used
from ocistage.cache.leftovers import Quarantined
from ocistage.cache.pyxisimages import SquashfsImage
from ocistage.cache.snapshots import SnapshotInfo
from ocistage.cache.store import Store

Evictable = Ref | Bundle | SnapshotInfo | SquashfsImage | Quarantined


@dataclass
class Plan:
    """The cache as GC sees it, and what it decided to remove."""

    refs: list[Ref]
    blobs: dict[Digest, Blob]
    bundles: list[Bundle]
    snapshots: list[SnapshotInfo]
    protected: set[str]
    footprint: Footprint
    started: float
    evicted_refs: list[Ref] = field(default_factory=list)
    evicted_bundles: set[str] = field(default_factory=set)
    evicted_snapshots: set[Digest] = field(default_factory=set)
    images: list[SquashfsImage] = field(default_factory=list)    # of the importer
    evicted_images: set[str] = field(default_factory=set)
    alias_indexes: set[Digest] = field(default_factory=set)  # what evictions made REF name
    quarantined: list[Quarantined] = field(default_factory=list)
    evicted_quarantine: set[Path] = field(default_factory=set)
    _frees: dict[Path, bool] = field(default_factory=dict)

    def frees(self, path: Path) -> bool:
        """Whether removing the tree at ``path`` frees its space now: the caller may remove
        it (its own, or root). Another member's tree is only evicted by rename, and its space
        is freed by its owner's next command (:mod:`ocistage.cache.evict`)."""
        if path not in self._frees:
            owner = owner_of(path)
            self._frees[path] = owner is None or may_remove(owner)
        return self._frees[path]

    def kept_refs(self) -> list[Ref]:
        gone = {id(r) for r in self.evicted_refs}
        return [r for r in self.refs if id(r) not in gone]

    def live_blobs(self) -> set[Digest]:
        keep = {d for ref in self.kept_refs() for d in ref.blobs}
        keep |= {d for d in self.blobs if f"blob:{d}" in self.protected}
        keep |= self.alias_indexes
        return keep

    def live_bundles(self) -> set[str]:
        manifests = {ref.digest for ref in self.kept_refs()}
        return {b.key for b in self.bundles
                if b.target in self.protected
                or (b.key not in self.evicted_bundles and b.manifest in manifests)}

    def live_snapshots(self) -> set[Digest]:
        chains = {c for ref in self.kept_refs() for c in ref.chain_ids}
        return {s.chain_id for s in self.snapshots
                if s.target in self.protected
                or (s.chain_id not in self.evicted_snapshots and s.chain_id in chains)}

    def settle(self) -> None:
        """Charge the footprint with what is no longer live: bundles, snapshots, then blobs
        (the order in which :mod:`ocistage.cache.gc` removes them)."""
        for entry in self.quarantined:
            if entry.path in self.evicted_quarantine and self.frees(entry.path):
                self.footprint.drop(entry.path)
        live_bundles = self.live_bundles()
        for bundle in self.bundles:
            if bundle.key not in live_bundles and self.frees(bundle.path):
                self.footprint.drop(bundle.path)
        live_snapshots = self.live_snapshots()
        for snapshot in self.snapshots:
            if snapshot.chain_id not in live_snapshots and self.frees(snapshot.path):
                self.footprint.drop(snapshot.path)
        live_blobs = self.live_blobs()
        for digest, blob in sorted(self.blobs.items()):
            if digest not in live_blobs:
                self.footprint.drop(blob.path)
        for image in self.images:
            if image.key in self.evicted_images:
                self.footprint.drop(image.path)
                self.footprint.drop(image.record)

    def size(self) -> int:
        """The cache's size on disk once what is not live is gone."""
        self.settle()
        return self.footprint.size()

    def evict(self, item: Evictable) -> None:
        if isinstance(item, Ref):
            self.evicted_refs.append(item)
        elif isinstance(item, Bundle):
            self.evicted_bundles.add(item.key)
        elif isinstance(item, SquashfsImage):
            self.evicted_images.add(item.key)
        elif isinstance(item, Quarantined):
            self.evicted_quarantine.add(item.path)
        else:
            self.evicted_snapshots.add(item.chain_id)


def choose_evictions(plan: Plan, store: Store, max_size: int | None, older_than: float | None,
                     now: float) -> list[str]:
    """Choose LRU refs, bundles, snapshots and importer images to evict: those last used
    more than ``older_than`` seconds ago, and more until the cache fits ``max_size``; returns
    what leases kept from eviction."""
    protected: list[str] = []
    for used, item in by_last_use(plan, usage.all_usage(store.root)):
        if isinstance(item, Quarantined):  # under pressure only: its age is step 1's
            used = now
        too_old = older_than is not None and now - used > older_than
        too_big = max_size is not None and plan.size() > max_size
        if not (too_old or too_big):
            continue
        target = item.target
        if target in plan.protected:
            protected.append(target)
        else:
            plan.evict(item)
    return protected


def by_last_use(plan: Plan, uses: dict[tuple[str, str], float]
                 ) -> list[tuple[float, Evictable]]:
    """What eviction may take, least recently used first (refs, bundles, snapshots, images on
    a tie); quarantined entries before everything (nothing uses them)."""
    live_bundles = plan.live_bundles()
    live_snapshots = plan.live_snapshots()
    candidates: list[tuple[float, Evictable]] = [
        *((float("-inf"), entry) for entry in plan.quarantined),
        *((ref_last_used(ref, uses), ref) for ref in plan.refs),
        *((bundle_last_used(b, uses), b) for b in plan.bundles if b.key in live_bundles),
        *((s.last_used, s) for s in plan.snapshots if s.chain_id in live_snapshots),
        *((image.last_used, image) for image in plan.images)]
    return sorted(candidates, key=lambda candidate: candidate[0])

