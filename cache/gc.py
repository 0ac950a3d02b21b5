"""``cache gc``: remove what nothing needs, then the least recently used, never what is in use.

One run, under ``CACHE/gc.lock`` (see :mod:`ocistage.cache.leases` for why that makes GC and running
commands race-free):

1. leftovers of dead processes: temp dirs, bundles being built, partial downloads nobody is
   downloading, stale lock files; temp files of atomic writes and ownerless temp dirs (a
   removal that was interrupted) older than an hour; quarantined entries older than a week;
   trees evicted earlier (:mod:`ocistage.cache.evict`);
2. leases: dead leases are dropped; a staged bundle whose leases are *all* dead (those on its
   place under every spelling, :func:`ocistage.cache.leases.staged_groups`) is removed if
   its marker ``<path>/.ocistage-staged.json`` (or, for a mounted image fetched from a URL,
   the outer marker beside it) names one of them, and then its leases are dropped. Removal is
   :func:`ocistage.cache.targetlayout.remove`: no symlink is followed, a squashfs mount is unmounted
   first, the tree is removed through descriptors, the image beside it goes too, and the target's
   pool is swept of entries no bundle links to any more. A removal that fails (a busy mount)
   keeps the leases, so the next GC tries again;
3. eviction, only when asked (``max_size``, ``older_than``): refs, cached bundles, layer
   snapshots and the squashfs images of ``ocistage-pyxis-importer``
   (:mod:`ocistage.cache.pyxisimages`), least recently used first, until the cache fits
   ``max_size``; those last used before ``older_than`` ago go whatever the size;
4. orphans: blobs that no remaining ref reaches, bundles whose manifest no remaining ref names,
   snapshots that no remaining ref's layers start with, last-use records of entries that are
   gone; records and reference notes of importer images that are gone, and the build locks of
   dead builders.

A tree (bundle, snapshot, quarantined entry, scratch) is taken out by
:func:`ocistage.cache.evict.take_out`: renamed aside beside it, then removed by its owner or
root. In a group-shared cache another member's tree is evicted by rename only and reported in
:attr:`GcReport.left` (to whom it is left), its space not counted as freed: its owner's next
command or root's gc removes it. Quarantined entries count against ``max_size`` and go first.

Never removed: anything a live lease (or ``keep``) names — ``image:<ref>`` keeps the ref and
every blob it reaches, ``bundle:<key>`` a bundle, ``snapshot:<chain id>`` a snapshot,
``blob:<digest>`` a blob, ``squashfs:<key>`` an importer image. Refs go first
(``index.json`` is rewritten under its lock, removing only entries that still point where they
did), then bundles and snapshots (renamed into a temp dir, then deleted, so no half tree is ever
visible at its path), then blobs, then importer images (one file each): the cache stays a valid
OCI layout at every moment.

Sizes are blocks on disk counted as ``du`` counts them (:mod:`ocistage.cache.footprint`): a file
hard-linked between a snapshot and bundles counts once, and removing one of them frees only
what no remaining part of the cache links (evicting a snapshot that a kept bundle links frees
its directories, not the bundle's files). The cache is measured once, before anything is
removed, and every removal is charged what it frees, so ``size_before - size_after`` is the sum
of the removals inside the cache, and ``size_after`` is what ``du`` shows afterwards. A dry run
lists exactly what the real run would remove, with the same sizes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.cache import pyxisimages, reserve, targetlayout, usage
from ocistage.cache.builddirs import scratch_is_dead
from ocistage.cache.digest import Digest
from ocistage.cache.errors import LockTimeout, StoreError
from ocistage.cache.evict import (
    Left,
    evicted_in,
    is_evicted,
    may_remove,
    owner_of,
    remove_evicted,
    take_out,
)
from ocistage.cache.footprint import Footprint, measure
from ocistage.cache.inventory import (
    Blob,
    Bundle,
    Ref,
    bundle_last_used,
    bundle_scratch_dirs,
    list_blobs,
    list_bundles,
    read_refs,
    ref_last_used,
)
from ocistage.cache.leases import (
    GC_LOCK,
    JobStates,
    Lease,
    all_leases,
    is_live,
    job_states_of,
    release,
    squeue_states,
    staged_groups,
)
from ocistage.cache.locks import FileLock, owner_is_dead
from ocistage.cache.notice import Kind, Notice
from ocistage.cache.owneddirs import OWNER_SUFFIX, owner_file
from ocistage.cache.pyxisimages import SquashfsImage, list_images
from ocistage.cache.sizes import count, format_size
from ocistage.cache.snapshots import SnapshotInfo, list_snapshots, snapshot_dir
from ocistage.cache.store import QUARANTINE, Store
from ocistage.cache.sweep import Removal, RemovalKind, Sweep
from ocistage.cache.treesize import tree_size
from ocistage.errors import NotFound

if TYPE_CHECKING:
    from ocistage.results import Renderer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Quarantined:
    """An entry of ``CACHE/quarantine``: kept a week for a post-mortem, or less when the cache
    is over its budget (it goes first: nothing uses it)."""

    path: Path
    when: float      # its mtime (``cache gc`` removes it a week later)

    @property
    def target(self) -> str:
        return f"quarantine:{self.path.name}"  # no lease names it


Evictable = Ref | Bundle | SnapshotInfo | SquashfsImage | Quarantined
LEFTOVER_TEMP_AGE = 3600.0
QUARANTINE_KEEP = 7 * 86400.0


@dataclass(frozen=True)
class GcOptions:
    max_size: int | None = None        # evict LRU refs/bundles until the cache fits
    older_than: float | None = None    # evict refs/bundles last used longer ago (seconds)
    dry_run: bool = False
    keep: frozenset[str] = frozenset()  # lease targets the caller uses (besides live leases)
    lock_timeout: float | None = 120.0  # wait this long for another GC (None: forever)


@dataclass(frozen=True)
class GcReport:
    removed: tuple[Removal, ...]
    protected: tuple[str, ...]     # what eviction would have taken but a lease or keep kept
    size_before: int               # the cache on disk, as du counts it
    size_after: int                # the same once the removals are done
    max_size: int | None
    dry_run: bool
    size_floor: int = 0            # of size_after, what no GC removes: directories, records
    left: tuple[Left, ...] = ()    # what the caller could not remove, and to whom it is left

    @property
    def freed(self) -> int:
        return sum(r.size for r in self.removed)

    @property
    def over_budget(self) -> bool:
        """Content that GC may not remove (leased, in use) keeps the cache over its budget."""
        return (self.max_size is not None
                and self.size_after > max(self.max_size, self.size_floor))

    def to_json(self) -> dict[str, Any]:
        """What ``cache gc --json`` and ``cache rm --json`` print."""
        return {**asdict(self), "freed": self.freed, "over_budget": self.over_budget,
                "left": [left.to_json() for left in self.left]}

    def render(self, out: Renderer) -> None:
        verb = "would remove" if self.dry_run else "removed"
        for removal in self.removed:
            if removal.kind == "usage":
                continue  # bookkeeping of entries listed anyway
            size = f" ({format_size(removal.size)})" if removal.size else ""
            out.detail(f"{verb} {removal.kind} {removal.name}{size}: {removal.reason}")
        for target in self.protected:
            out.detail(f"kept {target}: in use (leased)")
        for left in self.left:
            out.line(left.describe(self.dry_run))
        entries = count(len(self.removed), "entry", "entries")
        out.line(f"{verb} {entries}, {format_size(self.freed)}; "
                 f"cache {format_size(self.size_before)} -> {format_size(self.size_after)}")
        if self.left:
            owners = sorted({left.owner for left in self.left})
            out.line(f"{'would leave' if self.dry_run else 'left'} "
                     f"{count(len(self.left), 'entry', 'entries')} to "
                     f"{', '.join(owners)}: their next command (or root's `cache gc`) "
                     f"removes what was evicted")
        if self.over_budget and self.max_size is not None:
            out.warning(f"the cache holds {format_size(self.size_after)}, over its budget of "
                        f"{format_size(self.max_size)}: what remains is leased or in use")


# -- leftovers ---------------------------------------------------------------------------------

def _leftovers(sweep: Sweep[Removal], store: Store, now: float) -> None:
    _dead_scratch(sweep, store, now)
    _dead_partials(sweep, store)
    _interrupted_removals(sweep, store, now)
    _interrupted_writes(sweep, store, now)
    _old_quarantine(sweep, store, now)
    _evicted_trees(sweep, store)


def _take_out(sweep: Sweep[Removal], kind: RemovalKind, name: str, reason: str,
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


def _dead_scratch(sweep: Sweep[Removal], store: Store, now: float) -> None:
    """Temp dirs, stale locks and writers' temp files of dead processes (which the store
    removes itself), then bundles that dead processes were building."""
    for path in store.clean_leftovers(dry_run=sweep.dry_run):
        if is_evicted(path.name):
            sweep.remove("scratch", str(path), "evicted earlier", paths=(path,))
            continue
        owner = (owner_file(path),) if path.parent == store.tmp_dir else ()
        sweep.remove("scratch", str(path), "temp dir of a dead process", paths=(path, *owner))
    _others_dead_scratch(sweep, store)
    for path in bundle_scratch_dirs(store):
        if scratch_is_dead(path, now):
            _take_out(sweep, "scratch", str(path), "bundle build of a dead process", path)


def _others_dead_scratch(sweep: Sweep[Removal], store: Store) -> None:
    """Temp dirs of dead processes that :meth:`Store.clean_leftovers` left: another member's
    (theirs to remove), or one of ours holding what we may not remove."""
    with contextlib.suppress(FileNotFoundError):
        for marker in sorted(store.tmp_dir.glob(f"*{OWNER_SUFFIX}")):
            work = marker.with_suffix("")
            owner = owner_of(work)
            if owner is None or (sweep.dry_run and may_remove(owner)):
                continue  # gone, or listed by Store.clean_leftovers
            if owner_is_dead(marker):
                why = ("temp dir of a dead process; not yours: its owner's next command or "
                       "root's `cache gc` removes it") if not may_remove(owner) else (
                       "temp dir of a dead process; it holds entries you may not remove "
                       "(another member's), root's `cache gc` removes it")
                sweep.leave(Left("scratch", str(work), owner, why))


def _evicted_trees(sweep: Sweep[Removal], store: Store) -> None:
    """Trees evicted earlier (by a member's gc, or a removal that stopped halfway) that are
    still there: removed if the caller may (root; the owner's were removed when the cache
    was opened, unless they hold what it may not remove), else reported as left."""
    for directory in store.evicted_homes():
        for tree in evicted_in(directory):
            owner = owner_of(tree)
            if owner is None:
                continue
            if not may_remove(owner):
                sweep.leave(Left("evicted", str(tree), owner, "evicted by a gc; its owner's "
                                 "next command (or root's `cache gc`) removes it"))
                continue
            if sweep.dry_run:
                continue  # listed by Store.clean_leftovers already
            why = remove_evicted(tree)  # what clean_leftovers could not remove: once more
            if why is None:
                sweep.remove("scratch", str(tree), "evicted earlier", paths=(tree,))
            else:
                sweep.leave(Left("evicted", str(tree), owner, why))


def _dead_partials(sweep: Sweep[Removal], store: Store) -> None:
    """Partial downloads that no live process owns: taken over by their lock (a dry run takes
    no lock, it only asks whether the lock's owner is gone)."""
    for stem in _download_stems(store):
        path = store.ingest_dir / f"{stem}.partial"
        lock = FileLock(store.ingest_dir / f"{stem}.lock")
        if sweep.dry_run:
            if owner_is_dead(lock.path):  # else a live process is downloading this blob
                _remove_partial(sweep, path)
        elif lock.try_acquire():
            try:
                _remove_partial(sweep, path)
            finally:
                lock.release()


def _download_stems(store: Store) -> list[str]:
    stems: set[str] = set()
    with contextlib.suppress(FileNotFoundError), os.scandir(store.ingest_dir) as entries:
        for entry in entries:
            stem, dot, suffix = entry.name.partition(".")
            if dot and suffix in ("partial", "lock"):
                stems.add(stem)
    return sorted(stems)


def _remove_partial(sweep: Sweep[Removal], path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):  # none to remove: no removal
        sweep.remove("partial", str(path), "download nobody is finishing", paths=(path,),
                     action=path.unlink, otherwise=partial(_must_exist, path))


def _must_exist(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(path)


def _interrupted_removals(sweep: Sweep[Removal], store: Store, now: float) -> None:
    """Temp dirs without an owner file: a rename-then-delete that a crash interrupted."""
    with contextlib.suppress(FileNotFoundError), os.scandir(store.tmp_dir) as entries:
        tmp_entries = [Path(e.path) for e in entries]
    for path in tmp_entries:
        if (path.name.endswith(OWNER_SUFFIX) or is_evicted(path.name)
                or owner_file(path).exists()):
            continue
        with contextlib.suppress(FileNotFoundError):
            if now - os.lstat(path).st_mtime > LEFTOVER_TEMP_AGE:
                _take_out(sweep, "scratch", str(path), "removal interrupted by a crash", path)


def _interrupted_writes(sweep: Sweep[Removal], store: Store, now: float) -> None:
    """Old ``.*.tmp`` files of atomic writes."""
    for directory in (store.root, store.blobs / "sha256", store.blobs / "sha512",
                      store.root / "leases"):
        with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
            for entry in entries:
                if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and now - st.st_mtime > LEFTOVER_TEMP_AGE:
                        sweep.remove("leftover", entry.path, "temp file of an interrupted write",
                                     paths=(entry.path,), action=partial(os.unlink, entry.path))


def _old_quarantine(sweep: Sweep[Removal], store: Store, now: float) -> None:
    for entry in list_quarantine(store):
        if now - entry.when > QUARANTINE_KEEP:
            _take_out(sweep, "quarantine", str(entry.path), "quarantined more than a week ago",
                      entry.path)


def list_quarantine(store: Store) -> list[Quarantined]:
    """The entries of ``CACHE/quarantine`` (evicted ones aside), oldest first."""
    found: list[Quarantined] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(store.root / QUARANTINE) as q:
        for entry in q:
            if is_evicted(entry.name):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = entry.stat(follow_symlinks=False)
                found.append(Quarantined(Path(entry.path), st.st_mtime))
    return sorted(found, key=lambda q: q.when)


# -- leases and staged bundles -----------------------------------------------------------------

def _expire(sweep: Sweep[Removal], store: Store, leases: list[Lease],
            states: dict[str, str] | None) -> set[str]:
    """Drop dead leases (staged bundles included); return the live targets."""
    live: set[str] = set()
    staged_leases: list[Lease] = []
    for lease in leases:
        if lease.target.startswith("staged:") and not lease.also:
            staged_leases.append(lease)
        elif is_live(lease, states):
            live.update(lease.targets)
        else:
            _drop_lease(sweep, store, lease, "holder is gone")
    for group in staged_groups(staged_leases):  # one bundle, whatever its leases' spellings
        if any(is_live(lease, states) for lease in group):
            live.update(lease.target for lease in group)
        else:
            _expire_staged(sweep, store, group)
    return live


def _drop_lease(sweep: Sweep[Removal], store: Store, lease: Lease, why: str) -> None:
    sweep.remove("lease", lease.id, f"{why} ({lease.holder.describe()})",
                 paths=(store.root / "leases" / f"{lease.id}.json",),
                 action=partial(release, store.root, lease.id))


def _expire_staged(sweep: Sweep[Removal], store: Store, leases: list[Lease]) -> None:
    """Remove a staged bundle all of whose ``leases`` are dead, if its marker says it is ours
    (through the first of the leases' spellings of its path that leads to it), then drop the
    leases (all of them stay if the removal fails)."""
    ids = {lease.id for lease in leases}
    bundle, text = None, ""
    for text in dict.fromkeys(lease.target.removeprefix("staged:") for lease in leases):
        bundle = _own_staged(text, ids)
        if bundle is not None:
            break
    why = "dead lease of a staged path that is gone or not marked as this lease's"
    if bundle is not None:
        tree = 0 if bundle.mounted or bundle.remnant else tree_size(Path(text)).disk
        # a lease of the group stays until the removal is done: named in the outer marker
        # first, so an interrupted removal is finished next time (ocistage.cache.targetlayout)
        keep = min(bundle.lease_ids() & ids)
        try:
            sweep.remove("staged", text, "staged bundle whose leases are all dead",
                         size=bundle.image_size() + tree,
                         action=partial(targetlayout.remove, bundle, keep), otherwise=bundle.close)
        except (OSError, StoreError) as exc:  # e.g. a mount that is busy: retry next time
            log.warning("cannot remove staged bundle %s: %s", text, exc)
            return
        why = "dead lease of a removed staged bundle"
    for lease in leases:
        _drop_lease(sweep, store, lease, why)


def _own_staged(text: str, lease_ids: set[str]) -> targetlayout.StagedBundle | None:
    """The staged bundle at path ``text`` (opened) if its marker names one of ``lease_ids``."""
    path = Path(text)
    if not (path.is_absolute() and os.path.normpath(text) == text and text != "/"):
        return None
    bundle = targetlayout.open_staged(path)
    if bundle is not None and not bundle.lease_ids() & lease_ids:
        bundle.close()
        return None
    return bundle


# -- what stays --------------------------------------------------------------------------------

@dataclass
class _Plan:
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
        (the order in which :func:`_apply` removes them)."""
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


# -- eviction ----------------------------------------------------------------------------------

def _evict(plan: _Plan, store: Store, options: GcOptions, now: float) -> list[str]:
    """Choose LRU refs, bundles, snapshots and importer images to evict; returns what leases
    kept from eviction."""
    protected: list[str] = []
    for used, item in _by_last_use(plan, usage.all_usage(store.root)):
        if isinstance(item, Quarantined):  # under pressure only: its age is step 1's
            used = now
        too_old = options.older_than is not None and now - used > options.older_than
        too_big = options.max_size is not None and plan.size() > options.max_size
        if not (too_old or too_big):
            continue
        target = item.target
        if target in plan.protected:
            protected.append(target)
        else:
            plan.evict(item)
    return protected


def _by_last_use(plan: _Plan, uses: dict[tuple[str, str], float]
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


# -- removal -----------------------------------------------------------------------------------

def _apply(sweep: Sweep[Removal], plan: _Plan, store: Store) -> None:
    """Remove what the plan no longer keeps: refs, bundles, snapshots, blobs, importer images,
    last-use records."""
    for entry in plan.quarantined:
        if entry.path in plan.evicted_quarantine:
            _take_out(sweep, "quarantine", str(entry.path),
                      "quarantined; the cache is over its budget", entry.path)
    _evicted_refs(sweep, plan, store)
    live_bundles = plan.live_bundles()
    doomed = _orphan_bundles(sweep, plan, store, live_bundles)
    _orphan_snapshots(sweep, plan, store)
    _orphan_blobs(sweep, plan)
    _squashfs_images(sweep, plan, store)
    kept = {"image": {r.digest.hex for r in plan.kept_refs()}, "bundle": live_bundles,
            "squashfs": {i.key for i in plan.images if i.key not in plan.evicted_images}}
    gone = {("bundle", key) for key in doomed} | {("squashfs", k) for k in plan.evicted_images}
    _forget_stale_usage(sweep, store, kept, gone, plan.started)


def _evicted_refs(sweep: Sweep[Removal], plan: _Plan, store: Store) -> None:
    """Untag the evicted refs; index.json's change and new alias indexes
    (:mod:`ocistage.cache.refnames`) are charged to the first."""
    evicted = plan.evicted_refs
    if not evicted:
        return

    def chosen(entry: dict[str, Any]) -> bool:
        return any(ref.same_entry(entry) for ref in evicted)

    size = plan.footprint.size()
    index_size, documents = store.preview_untag(chosen)
    plan.alias_indexes |= {Digest.of_bytes(d) for d in documents}
    aliases = [(store.blob_path(Digest.of_bytes(d)), len(d)) for d in documents]
    aliases = [(path, n) for path, n in aliases if not plan.footprint.has(path)]
    sweep.run(partial(store.untag, chosen))
    for path, n in [(store.root / "index.json", index_size), *aliases]:
        sweep.rewritten(path, n)
    shrunk = size - plan.footprint.size()
    for n, ref in enumerate(evicted):
        label = f"{ref.name} ({ref.platform})" if ref.platform else ref.name
        sweep.remove("ref", label, "least recently used", size=0 if n else shrunk)


def _orphan_bundles(sweep: Sweep[Removal], plan: _Plan, store: Store,
                    live: set[str]) -> set[str]:
    """Remove the cached bundles that are not ``live``; returns their keys."""
    doomed = [b for b in plan.bundles if b.key not in live]
    for bundle in doomed:
        reason = ("least recently used" if bundle.key in plan.evicted_bundles
                  else "its image is no longer cached" if bundle.manifest is not None
                  else "made from an unknown image")
        _take_out(sweep, "bundle", bundle.key, reason, bundle.path)
    return {b.key for b in doomed}


def _orphan_snapshots(sweep: Sweep[Removal], plan: _Plan, store: Store) -> None:
    live = plan.live_snapshots()
    for snapshot in plan.snapshots:
        if snapshot.chain_id in live:
            continue
        reason = ("least recently used" if snapshot.chain_id in plan.evicted_snapshots
                  else "no cached image has these layers")
        _take_out(sweep, "snapshot", str(snapshot.chain_id), reason,
                  snapshot_dir(store, snapshot.chain_id))


def _orphan_blobs(sweep: Sweep[Removal], plan: _Plan) -> None:
    live = plan.live_blobs()
    for digest, blob in sorted(plan.blobs.items()):
        if digest not in live:
            sweep.remove("blob", str(digest), "no cached image uses it", paths=(blob.path,),
                         action=partial(blob.path.unlink, missing_ok=True))


def _squashfs_images(sweep: Sweep[Removal], plan: _Plan, store: Store) -> None:
    """Remove the evicted importer images (the image first: a record without one is a stray),
    then the strays: records and reference notes of gone images, build locks of dead builders."""
    for image in plan.images:
        if image.key in plan.evicted_images:
            sweep.remove("squashfs", image.key, f"least recently used ({image.source or '?'})",
                         paths=(image.path, image.record),
                         action=partial(_unlink_all, image.path, image.record))
    # a leased key may be published while GC runs (its get waited for no GC: it was leased
    # before GC read the leases): its record and notes are no strays
    held = {t.removeprefix("squashfs:") for t in plan.protected if t.startswith("squashfs:")}
    kept = held | {image.key for image in plan.images if image.key not in plan.evicted_images}
    listed = held | {image.key for image in plan.images}
    for path in pyxisimages.stray_records(store.root, listed, kept):
        sweep.remove("leftover", str(path), "record of an image that is gone", paths=(path,),
                     action=partial(_unlink_all, path))
    for path in pyxisimages.dead_build_locks(store.root):
        sweep.remove("scratch", str(path), "build lock of a dead process", paths=(path,),
                     action=partial(_break_lock, path))


def _unlink_all(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _break_lock(path: Path) -> None:
    lock = FileLock(path)
    if lock.try_acquire():  # broken as stale, then ours: released, which removes it
        lock.release()


def _forget_stale_usage(sweep: Sweep[Removal], store: Store, kept: dict[str, set[str]],
                        doomed: set[tuple[str, str]], started: float) -> None:
    """Drop last-use records of removed entries (``doomed``: kind and key) and of gone ones
    (not in ``kept``, by kind; not those a running command touched since)."""
    for (kind, key), used in usage.all_usage(store.root).items():
        if used >= started and (kind, key) not in doomed:
            continue
        if key not in kept.get(kind, {key}):
            usage_kind: usage.UsageKind = "image" if kind == "image" else (
                "bundle" if kind == "bundle" else "squashfs")
            sweep.remove("usage", f"{kind}-{key}", "its entry is gone",
                         paths=(usage.usage_path(store.root, usage_kind, key),),
                         action=partial(usage.forget, store.root, usage_kind, key))


# -- the entry points --------------------------------------------------------------------------

def collect(store: Store, options: GcOptions | None = None,
            job_states: JobStates = squeue_states, now: float | None = None) -> GcReport:
    """Run one GC over ``store`` (see the module docstring); returns what it removed."""
    options = options or GcOptions()
    now = time.time() if now is None else now
    if options.dry_run:
        return _collect(store, options, job_states, now)
    with reserve.spent(store.root):  # room for the lock and the index on a full filesystem
        lock = FileLock(store.root / GC_LOCK, heartbeat=1.0)
        try:
            lock.acquire(timeout=options.lock_timeout)
        except LockTimeout as exc:
            raise LockTimeout(f"another `ocistage cache gc` is running on {store.root}",
                              "wait for it to finish, or retry later") from exc
        try:
            return _collect(store, options, job_states, now)
        finally:
            lock.release()


def _collect(store: Store, options: GcOptions, job_states: JobStates, now: float) -> GcReport:
    started = time.time()
    footprint = measure(store.root, skip=(GC_LOCK,))
    size_before = footprint.size()
    sweep: Sweep[Removal] = Sweep(options.dry_run, footprint)
    _leftovers(sweep, store, now)
    leases = all_leases(store.root)
    live = _expire(sweep, store, leases, job_states_of(leases, job_states))
    plan = _Plan(refs=read_refs(store), blobs=list_blobs(store), bundles=list_bundles(store),
                 snapshots=list_snapshots(store), images=list_images(store.root),
                 protected=live | set(options.keep),
                 footprint=footprint, started=started,
                 quarantined=[entry for entry in list_quarantine(store)  # older: step 1's
                              if now - entry.when <= QUARANTINE_KEEP])
    protected_refs = {t.removeprefix("image:") for t in plan.protected if t.startswith("image:")}
    plan.protected |= {ref.target for ref in plan.refs if ref.name in protected_refs}
    kept: list[str] = []
    if options.max_size is not None or options.older_than is not None:
        kept = _evict(plan, store, options, now)
    _apply(sweep, plan, store)
    return GcReport(removed=tuple(sweep.records), protected=tuple(dict.fromkeys(kept)),
                    size_before=size_before, size_after=plan.size(),
                    max_size=options.max_size, dry_run=options.dry_run,
                    size_floor=footprint.floor(), left=tuple(sweep.left))


def remove_ref(store: Store, name: str, platform: str | None = None, force: bool = False,
               job_states: JobStates = squeue_states) -> GcReport:
    """``cache rm``: drop ref ``name`` (one ``platform``, ``os/arch[/variant]``, or all) and
    at once everything only it used, as a GC without eviction does.

    A ref that a live lease names is refused unless ``force``; even then, leased blobs and
    bundles stay until their lease ends (a later GC removes them).
    """
    with reserve.spent(store.root):
        lock = FileLock(store.root / GC_LOCK, heartbeat=1.0)
        lock.acquire(timeout=GcOptions().lock_timeout)
        try:
            refs = _refs_named(store, name, platform)
            if not force:
                _refuse_if_leased(store, name, job_states)
            store.untag(lambda entry: any(ref.same_entry(entry) for ref in refs))
            report = _collect(store, GcOptions(), job_states, time.time())
        finally:
            lock.release()
    dropped = tuple(Removal("ref", f"{r.name} ({r.platform})" if r.platform else r.name, 0,
                            "removed on request") for r in refs)
    return GcReport(removed=dropped + report.removed, protected=report.protected,
                    size_before=report.size_before, size_after=report.size_after,
                    max_size=None, dry_run=False, size_floor=report.size_floor,
                    left=report.left)


def _refs_named(store: Store, name: str, platform: str | None) -> list[Ref]:
    """The cached refs ``name`` (of ``platform`` and its variants, or all); NotFound if none."""
    refs = [ref for ref in read_refs(store) if ref.name == name and (
        platform is None or ref.platform == platform or ref.platform.startswith(platform + "/"))]
    if not refs:
        raise NotFound(f"{name}{' for ' + platform if platform else ''} is not in the cache",
                       "`ocistage cache ls` lists the cached images")
    return refs


def _refuse_if_leased(store: Store, name: str, job_states: JobStates) -> None:
    leases = [lease for lease in all_leases(store.root) if f"image:{name}" in lease.targets]
    states = job_states_of(leases, job_states)
    holders = [lease.holder.describe() for lease in leases if is_live(lease, states)]
    if holders:
        raise StoreError(f"{name} is in use ({', '.join(holders)})",
                         "wait until it is released, or pass --force to drop the ref "
                         "anyway (leased content stays until its lease ends)")


def enforce_budget(store: Store, max_size: int, keep: Iterable[str] = (),
                   job_states: JobStates = squeue_states) -> tuple[Notice, ...]:
    """GC down to ``max_size`` after a pull; returns warnings (never fails the pull for it).

    If another GC is running this one is skipped: that GC is already making room.
    """
    lock = FileLock(store.root / GC_LOCK, heartbeat=1.0)
    if not lock.try_acquire():
        return ()
    try:
        report = _collect(store, GcOptions(max_size=max_size, keep=frozenset(keep)),
                          job_states, time.time())
    finally:
        lock.release()
    if report.over_budget:
        return (Notice(Kind.OVER_BUDGET,
                       f"the cache holds {format_size(report.size_after)}, over its budget of "
                       f"{format_size(max_size)}: the rest is in use or leased"),)
    return ()
