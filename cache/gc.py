"""``cache gc``: remove what nothing needs, then the least recently used, never what is in use.

One run, under ``CACHE/gc.lock`` (see :mod:`ocistage.cache.leases` for why that makes GC and running
commands race-free):

1. leftovers of dead processes: temp dirs, bundles being built, partial downloads nobody is
   downloading, stale lock files; temp files of atomic writes and ownerless temp dirs (a
   removal that was interrupted) older than an hour; quarantined entries older than a week;
   trees evicted earlier (:mod:`ocistage.cache.evict`) — :mod:`ocistage.cache.leftovers`;
2. leases (:mod:`ocistage.cache.leaseexpiry`): dead leases are dropped; a staged bundle whose
   leases are *all* dead (those on its place under every spelling,
   :func:`ocistage.cache.leases.staged_groups`) is removed if its marker
   ``<path>/.ocistage-staged.json`` (or, for a mounted image fetched from a URL, the outer
   marker beside it) names one of them, and then its leases are dropped. Removal is
   :func:`ocistage.cache.targetlayout.remove`: no symlink is followed, a squashfs mount is unmounted
   first, the tree is removed through descriptors, the image beside it goes too, and the target's
   pool is swept of entries no bundle links to any more. A removal that fails (a busy mount)
   keeps the leases, so the next GC tries again;
3. eviction, only when asked (``max_size``, ``older_than``; :mod:`ocistage.cache.gcplan`):
   refs, cached bundles, layer snapshots and the squashfs images of ``ocistage-pyxis-importer``
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
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.cache import pyxisimages, reserve, usage
from ocistage.cache.digest import Digest
from ocistage.cache.errors import LockTimeout, StoreError
from ocistage.cache.evict import Left
from ocistage.cache.footprint import measure
from ocistage.cache.gcplan import Plan, choose_evictions
from ocistage.cache.inventory import Ref, list_blobs, list_bundles, read_refs
from ocistage.cache.leaseexpiry import expire_leases
from ocistage.cache.leases import (
    GC_LOCK,
    JobStates,
    all_leases,
    is_live,
    job_states_of,
    squeue_states,
)
from ocistage.cache.leftovers import QUARANTINE_KEEP, list_quarantine, sweep_leftovers
from ocistage.cache.locks import FileLock
from ocistage.cache.notice import Kind, Notice
from ocistage.cache.pyxisimages import list_images
from ocistage.cache.sizes import count, format_age, format_size
from ocistage.cache.snapshots import list_snapshots, snapshot_dir
from ocistage.cache.store import Store
from ocistage.cache.sweep import Removal, Sweep, take_out_tree
from ocistage.errors import NotFound

if TYPE_CHECKING:
    from ocistage.results import Renderer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcOptions:
    max_size: int | None = None        # evict LRU refs/bundles until the cache fits
    older_than: float | None = None    # evict refs/bundles last used longer ago (seconds)
    dry_run: bool = False
    keep: frozenset[str] = frozenset()  # lease targets the caller uses (besides live leases)
    lock_timeout: float | None = 120.0  # wait this long for another GC (None: forever)
    #: the store is read by users who leave no lease (a site's pyxis_store): an evicted
    #: importer image is retired first and removed RETIRE_GRACE later (pyxisimages)
    retire_images: bool = False


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
        evicted = [left for left in self.left if left.kind != "staged"]  # node copies: above
        if evicted:
            owners = sorted({left.owner for left in evicted})
            out.line(f"{'would leave' if self.dry_run else 'left'} "
                     f"{count(len(evicted), 'entry', 'entries')} to "
                     f"{', '.join(owners)}: their next command (or root's `cache gc`) "
                     f"removes what was evicted")
        if self.over_budget and self.max_size is not None:
            out.warning(f"the cache holds {format_size(self.size_after)}, over its budget of "
                        f"{format_size(self.max_size)}: what remains is leased or in use")


# -- removal -----------------------------------------------------------------------------------

def _apply(sweep: Sweep[Removal], plan: Plan, store: Store,
           retiring: frozenset[str] = frozenset(), now: float = 0.0) -> None:
    """Remove what the plan no longer keeps: refs, bundles, snapshots, blobs, importer images,
    last-use records."""
    for entry in plan.quarantined:
        if entry.path in plan.evicted_quarantine:
            take_out_tree(sweep, "quarantine", str(entry.path),
                      "quarantined; the cache is over its budget", entry.path)
    _evicted_refs(sweep, plan, store)
    live_bundles = plan.live_bundles()
    doomed = _orphan_bundles(sweep, plan, store, live_bundles)
    _orphan_snapshots(sweep, plan, store)
    _orphan_blobs(sweep, plan)
    _squashfs_images(sweep, plan, store, set(retiring), now)
    kept = {"image": {r.digest.hex for r in plan.kept_refs()}, "bundle": live_bundles,
            "squashfs": {i.key for i in plan.images if i.key not in plan.evicted_images}}
    gone = {("bundle", key) for key in doomed} | {("squashfs", k) for k in plan.evicted_images}
    _forget_stale_usage(sweep, store, kept, gone, plan.started)


def _evicted_refs(sweep: Sweep[Removal], plan: Plan, store: Store) -> None:
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


def _orphan_bundles(sweep: Sweep[Removal], plan: Plan, store: Store,
                    live: set[str]) -> set[str]:
    """Remove the cached bundles that are not ``live``; returns their keys."""
    doomed = [b for b in plan.bundles if b.key not in live]
    for bundle in doomed:
        reason = ("least recently used" if bundle.key in plan.evicted_bundles
                  else "its image is no longer cached" if bundle.manifest is not None
                  else "made from an unknown image")
        take_out_tree(sweep, "bundle", bundle.key, reason, bundle.path)
    return {b.key for b in doomed}


def _orphan_snapshots(sweep: Sweep[Removal], plan: Plan, store: Store) -> None:
    live = plan.live_snapshots()
    for snapshot in plan.snapshots:
        if snapshot.chain_id in live:
            continue
        reason = ("least recently used" if snapshot.chain_id in plan.evicted_snapshots
                  else "no cached image has these layers")
        take_out_tree(sweep, "snapshot", str(snapshot.chain_id), reason,
                  snapshot_dir(store, snapshot.chain_id))


def _orphan_blobs(sweep: Sweep[Removal], plan: Plan) -> None:
    live = plan.live_blobs()
    for digest, blob in sorted(plan.blobs.items()):
        if digest not in live:
            sweep.remove("blob", str(digest), "no cached image uses it", paths=(blob.path,),
                         action=partial(blob.path.unlink, missing_ok=True))


def _squashfs_images(sweep: Sweep[Removal], plan: Plan, store: Store,
                     retiring: set[str], now: float) -> None:
    """Retire the images in ``retiring``, remove the evicted ones (the image first: a record
    without one is a stray), then the strays: records, retirement markers and reference notes
    of gone images, build locks of dead builders."""
    for image in plan.images:
        gone = (image.path, image.record, pyxisimages.retired_path_at(store.root, image.key))
        if image.key in retiring:
            sweep.remove("squashfs", image.key,
                         f"least recently used ({image.source or '?'}); retired: no get hands "
                         f"it out, a gc removes it {format_age(pyxisimages.RETIRE_GRACE)} "
                         "from now", size=0,
                         action=partial(pyxisimages.retire, store.root, image.key))
        elif image.key in plan.evicted_images:
            reason = (f"retired {format_age(now - image.retired)} ago"
                      if image.retired is not None else "least recently used")
            sweep.remove("squashfs", image.key, f"{reason} ({image.source or '?'})",
                         paths=gone, action=partial(_unlink_all, *gone))
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


def _retirements(plan: Plan, retire: bool, now: float) -> frozenset[str]:
    """Settle the plan's importer images retired or to retire (docs/site.md): a retired one
    no lease holds is evicted once its grace has passed and kept until then; with
    ``retire``, an evicted one not retired yet is kept and retired (returned)."""
    retiring = set()
    for image in plan.images:
        if image.retired is not None:
            if (now - image.retired >= pyxisimages.RETIRE_GRACE
                    and image.target not in plan.protected):
                plan.evicted_images.add(image.key)
            else:
                plan.evicted_images.discard(image.key)
        elif retire and image.key in plan.evicted_images:
            plan.evicted_images.discard(image.key)
            retiring.add(image.key)
    return frozenset(retiring)


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
    sweep_leftovers(sweep, store, now)
    leases = all_leases(store.root)
    live = expire_leases(sweep, store, leases, job_states_of(leases, job_states), now)
    plan = Plan(refs=read_refs(store), blobs=list_blobs(store), bundles=list_bundles(store),
                 snapshots=list_snapshots(store), images=list_images(store.root),
                 protected=live | set(options.keep),
                 footprint=footprint, started=started,
                 quarantined=[entry for entry in list_quarantine(store)  # older: step 1's
                              if now - entry.when <= QUARANTINE_KEEP])
    protected_refs = {t.removeprefix("image:") for t in plan.protected if t.startswith("image:")}
    plan.protected |= {ref.target for ref in plan.refs if ref.name in protected_refs}
    kept: list[str] = []
    if options.max_size is not None or options.older_than is not None:
        kept = choose_evictions(plan, store, options.max_size, options.older_than, now)
    retiring = _retirements(plan, options.retire_images, now)
    _apply(sweep, plan, store, retiring, now)
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
