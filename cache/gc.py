"""``cache gc``: remove what nothing needs, then the least recently used, never what is in use.

One run, under ``CACHE/gc.lock`` (see :mod:`ocistage.cache.leases` for why that makes GC and running
commands race-free):

1. leftovers of dead processes: temp dirs, bundles being built, partial downloads nobody is
   downloading, stale lock files; temp files of atomic writes and ownerless temp dirs (a
   removal that was interrupted) older than an hour; quarantined entries older than a week;
2. leases: dead leases are dropped; a staged bundle whose leases are *all* dead (those on its
   place under every spelling, :func:`ocistage.cache.leases.staged_groups`) is removed if
   its marker ``<path>/.ocistage-staged.json`` (or, for a mounted image fetched from a URL,
   the outer marker beside it) names one of them, and then its leases are dropped. Removal is
   :func:`ocistage.cache.staged.remove`: no symlink is followed, a squashfs mount is unmounted
   first, the tree is removed through descriptors, the image beside it goes too, and the target's
   pool is swept of entries no bundle links to any more. A removal that fails (a busy mount)
   keeps the leases, so the next GC tries again;
3. eviction, only when asked (``max_size``, ``older_than``): refs, cached bundles and layer
   snapshots, least recently used first, until the cache fits ``max_size``; those last used
   before ``older_than`` ago go whatever the size;
4. orphans: blobs that no remaining ref reaches, bundles whose manifest no remaining ref names,
   snapshots that no remaining ref's layers start with, last-use records of entries that are
   gone.

Never removed: anything a live lease (or ``keep``) names — ``image:<ref>`` keeps the ref and
every blob it reaches, ``bundle:<key>`` a bundle, ``snapshot:<chain id>`` a snapshot,
``blob:<digest>`` a blob. Refs go first (``index.json`` is rewritten under its lock, removing
only entries that still point where they did), then bundles and snapshots (renamed into a temp
dir, then deleted, so no half tree is ever visible at its path), then blobs: the cache stays a
valid OCI layout at every moment.

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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ocistage.cache import staged, usage
from ocistage.cache.digest import Digest
from ocistage.cache.errors import LockTimeout, NotFound, StoreError
from ocistage.cache.footprint import Footprint, measure
from ocistage.cache.fsops import OWNER_SUFFIX, owner_file, remove_tree
from ocistage.cache.inventory import (
    QUARANTINE,
    Blob,
    Bundle,
    Ref,
    bundle_last_used,
    bundle_scratch_dirs,
    list_blobs,
    list_bundles,
    read_refs,
    ref_last_used,
    snapshot_target,
    tree_size,
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
from ocistage.cache.sizes import format_size
from ocistage.cache.snapshots import SnapshotInfo, list_snapshots, remove_snapshot
from ocistage.cache.store import Store, scratch_is_dead

log = logging.getLogger(__name__)
LEFTOVER_TEMP_AGE = 3600.0
QUARANTINE_KEEP = 7 * 86400.0
RemovalKind = Literal["ref", "blob", "bundle", "snapshot", "staged", "lease", "scratch",
                      "partial", "leftover", "quarantine", "usage"]


@dataclass(frozen=True)
class GcOptions:
    max_size: int | None = None        # evict LRU refs/bundles until the cache fits
    older_than: float | None = None    # evict refs/bundles last used longer ago (seconds)
    dry_run: bool = False
    keep: frozenset[str] = frozenset()  # lease targets the caller uses (besides live leases)
    lock_timeout: float | None = 120.0  # wait this long for another GC (None: forever)


@dataclass(frozen=True)
class Removal:
    kind: RemovalKind
    name: str
    size: int          # bytes on disk this frees (inside the cache: as du counts them)
    reason: str


@dataclass(frozen=True)
class GcReport:
    removed: tuple[Removal, ...]
    protected: tuple[str, ...]     # what eviction would have taken but a lease or keep kept
    size_before: int               # the cache on disk, as du counts it
    size_after: int                # the same once the removals are done
    max_size: int | None
    dry_run: bool
    size_floor: int = 0            # of size_after, what no GC removes: directories, records


    @property
    def freed(self) -> int:
        return sum(r.size for r in self.removed)

    @property
    def over_budget(self) -> bool:
        """Content that GC may not remove (leased, in use) keeps the cache over its budget."""
        return (self.max_size is not None
                and self.size_after > max(self.max_size, self.size_floor))


# -- leftovers ---------------------------------------------------------------------------------

def _leftovers(store: Store, dry_run: bool, now: float, footprint: Footprint) -> list[Removal]:
    removed: list[Removal] = []
    for path in store.clean_leftovers(dry_run=dry_run):
        size = footprint.drop(path)
        if path.parent == store.tmp_dir:
            size += footprint.drop(owner_file(path))
        removed.append(Removal("scratch", str(path), size, "temp dir of a dead process"))
    for path in bundle_scratch_dirs(store):
        if scratch_is_dead(path, now):
            size = footprint.drop(path)
            if not dry_run:
                remove_tree(path)
            removed.append(Removal("scratch", str(path), size, "bundle build of a dead process"))
    removed.extend(_dead_partials(store, dry_run, footprint))
    with contextlib.suppress(FileNotFoundError), os.scandir(store.tmp_dir) as entries:
        tmp_entries = [Path(e.path) for e in entries]
    for path in tmp_entries:  # no owner file: a rename-then-delete that a crash interrupted
        if path.name.endswith(OWNER_SUFFIX) or owner_file(path).exists():
            continue
        with contextlib.suppress(FileNotFoundError):
            if now - os.lstat(path).st_mtime > LEFTOVER_TEMP_AGE:
                size = footprint.drop(path)
                if not dry_run:
                    remove_tree(path)
                removed.append(Removal("scratch", str(path), size,
                                       "removal interrupted by a crash"))
    for directory in (store.root, store.blobs / "sha256", store.blobs / "sha512",
                      store.root / "leases"):
        with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
            for entry in entries:
                if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and now - st.st_mtime > LEFTOVER_TEMP_AGE:
                        if not dry_run:
                            os.unlink(entry.path)
                        removed.append(Removal("leftover", entry.path, footprint.drop(entry.path),
                                               "temp file of an interrupted write"))
    with contextlib.suppress(FileNotFoundError), os.scandir(store.root / QUARANTINE) as q:
        for entry in q:
            with contextlib.suppress(FileNotFoundError):
                if now - entry.stat(follow_symlinks=False).st_mtime > QUARANTINE_KEEP:
                    size = footprint.drop(entry.path)
                    if not dry_run:
                        remove_tree(Path(entry.path))
                    removed.append(Removal("quarantine", entry.path, size,
                                           "quarantined more than a week ago"))
    return removed


def _dead_partials(store: Store, dry_run: bool, footprint: Footprint) -> list[Removal]:
    """Partial downloads that no live process owns (taken over by their lock; a dry run only
    asks whether the lock's owner is gone)."""
    removed: list[Removal] = []
    names: set[str] = set()
    with contextlib.suppress(FileNotFoundError), os.scandir(store.ingest_dir) as entries:
        for entry in entries:
            stem, dot, suffix = entry.name.partition(".")
            if dot and suffix in ("partial", "lock"):
                names.add(stem)
    for stem in sorted(names):
        partial = store.ingest_dir / f"{stem}.partial"
        lock = FileLock(store.ingest_dir / f"{stem}.lock")
        if dry_run:
            if not owner_is_dead(lock.path):
                continue  # a live process is downloading this blob
            if partial.exists():
                removed.append(Removal("partial", str(partial), footprint.drop(partial),
                                       "download nobody is finishing"))
            continue
        if not lock.try_acquire():
            continue
        try:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
                removed.append(Removal("partial", str(partial), footprint.drop(partial),
                                       "download nobody is finishing"))
        finally:
            lock.release()
    return removed


# -- leases and staged bundles -----------------------------------------------------------------

def _open_marked(text: str, ids: set[str]) -> staged.StagedBundle | None:
    """The staged bundle at ``text`` if its marker names one of ``ids``."""
    path = Path(text)
    normal = path.is_absolute() and os.path.normpath(text) == text and text != "/"
    bundle = staged.open_staged(path) if normal else None
    if bundle is not None and not bundle.lease_ids() & ids:
        bundle.close()
        bundle = None
    return bundle


def _remove_staged(leases: list[Lease], dry_run: bool) -> list[Removal]:
    """Remove a staged bundle all of whose ``leases`` are dead, if its marker says it is ours
    (through the first of the leases' spellings of its path that leads to it).

    Returns the removals, the dead leases included; the caller drops those leases.
    """
    removed: list[Removal] = []
    ids = {lease.id for lease in leases}
    bundle, text = None, ""
    for text in dict.fromkeys(lease.target.removeprefix("staged:") for lease in leases):
        bundle = _open_marked(text, ids)
        if bundle is not None:
            break
    path = Path(text)
    if bundle is not None:
        size = bundle.image_size() + (0 if bundle.mounted else tree_size(path).disk)
        if dry_run:
            bundle.close()
        else:
            try:
                staged.remove(bundle)
            except (OSError, StoreError) as exc:  # e.g. a mount that is busy: retry next time
                log.warning("cannot remove staged bundle %s: %s", text, exc)
                return []
        removed.append(Removal("staged", text, size, "staged bundle whose leases are all dead"))
        reason = "dead lease of a removed staged bundle"
    else:
        reason = "dead lease of a staged path that is gone or not marked as this lease's"
    removed.extend(Removal("lease", lease.id, 0, f"{reason} ({lease.holder.describe()})")
                   for lease in leases)
    return removed


def _lease_file(store: Store, lease_id: str) -> Path:
    return store.root / "leases" / f"{lease_id}.json"


def _expire(store: Store, leases: list[Lease], states: dict[str, str] | None,
            dry_run: bool, footprint: Footprint) -> tuple[list[Removal], set[str]]:
    """Drop dead leases (staged bundles included); return the removals and the live targets."""
    removed: list[Removal] = []
    live: set[str] = set()
    staged: list[Lease] = []
    for lease in leases:
        if lease.target.startswith("staged:") and not lease.also:
            staged.append(lease)
            continue
        if is_live(lease, states):
            live.update(lease.targets)
        else:
            if not dry_run:
                release(store.root, lease.id)
            removed.append(Removal("lease", lease.id,
                                   footprint.drop(_lease_file(store, lease.id)),
                                   f"holder is gone ({lease.holder.describe()})"))
    for group in staged_groups(staged):  # one bundle, whatever its leases' spellings of it
        if any(is_live(lease, states) for lease in group):
            live.update(lease.target for lease in group)
            continue
        for removal in _remove_staged(group, dry_run):
            if removal.kind == "lease":
                if not dry_run:
                    release(store.root, removal.name)
                removal = replace(removal, size=footprint.drop(_lease_file(store, removal.name)))
            removed.append(removal)
    return removed, live


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
    alias_indexes: set[Digest] = field(default_factory=set)  # what evictions made REF name

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
                if snapshot_target(s) in self.protected
                or (s.chain_id not in self.evicted_snapshots and s.chain_id in chains)}

    def settle(self) -> None:
        """Charge the footprint with what is no longer live: bundles, snapshots, then blobs
        (the order in which :func:`_apply` removes them)."""
        live_bundles = self.live_bundles()
        for bundle in self.bundles:
            if bundle.key not in live_bundles:
                self.footprint.drop(bundle.path)
        live_snapshots = self.live_snapshots()
        for snapshot in self.snapshots:
            if snapshot.chain_id not in live_snapshots:
                self.footprint.drop(snapshot.path)
        live_blobs = self.live_blobs()
        for digest, blob in sorted(self.blobs.items()):
            if digest not in live_blobs:
                self.footprint.drop(blob.path)

    def size(self) -> int:
        """The cache's size on disk once what is not live is gone."""
        self.settle()
        return self.footprint.size()


def _evict(plan: _Plan, store: Store, options: GcOptions, now: float) -> list[str]:
    """Choose LRU refs and bundles to evict; returns what leases kept from eviction."""
    uses = usage.all_usage(store.root)
    candidates: list[tuple[float, int, Ref | Bundle | SnapshotInfo]] = []
    for ref in plan.refs:
        candidates.append((ref_last_used(ref, uses), len(candidates), ref))
    live_bundles = plan.live_bundles()
    for bundle in plan.bundles:
        if bundle.key in live_bundles:
            candidates.append((bundle_last_used(bundle, uses), len(candidates), bundle))
    live_snapshots = plan.live_snapshots()
    for snapshot in plan.snapshots:
        if snapshot.chain_id in live_snapshots:
            candidates.append((snapshot.last_used, len(candidates), snapshot))
    candidates.sort(key=lambda c: (c[0], c[1]))
    protected: list[str] = []
    for used, _, item in candidates:
        too_old = options.older_than is not None and now - used > options.older_than
        too_big = options.max_size is not None and plan.size() > options.max_size
        if not (too_old or too_big):
            continue
        target = snapshot_target(item) if isinstance(item, SnapshotInfo) else item.target
        if target in plan.protected:
            protected.append(target)
            continue
        if isinstance(item, Ref):
            plan.evicted_refs.append(item)
        elif isinstance(item, Bundle):
            plan.evicted_bundles.add(item.key)
        else:
            plan.evicted_snapshots.add(item.chain_id)
    return protected


def _apply(plan: _Plan, store: Store, dry_run: bool) -> list[Removal]:
    removed: list[Removal] = []
    evicted = plan.evicted_refs
    if evicted:
        def chosen(entry: dict[str, Any]) -> bool:
            return any(ref.same_entry(entry) for ref in evicted)

        size = plan.footprint.size()
        index_size, documents = store.preview_untag(chosen)
        plan.alias_indexes |= {Digest.of_bytes(d) for d in documents}
        aliases = [(store.blob_path(Digest.of_bytes(d)), len(d)) for d in documents]
        aliases = [(path, n) for path, n in aliases if not plan.footprint.has(path)]
        if dry_run:
            plan.footprint.predict(store.root / "index.json", index_size)
            for path, n in aliases:
                plan.footprint.predict(path, n)
        else:
            store.untag(chosen)
            for path in [store.root / "index.json", *(path for path, _ in aliases)]:
                plan.footprint.refresh(path)
        # index.json's change and new alias indexes (ocistage.cache.refnames): charged to the first
        # ref
        shrunk = size - plan.footprint.size()
        for n, ref in enumerate(evicted):
            label = f"{ref.name} ({ref.platform})" if ref.platform else ref.name
            removed.append(Removal("ref", label, 0 if n else shrunk, "least recently used"))
    live_bundles = plan.live_bundles()
    doomed = [b for b in plan.bundles if b.key not in live_bundles]
    if doomed and not dry_run:
        trash = store.temp_dir("gc")
        try:
            for bundle in doomed:
                with contextlib.suppress(FileNotFoundError):
                    os.rename(bundle.path, trash / bundle.key)
            remove_tree(trash)
        finally:
            store.remove_temp_dir(trash)
    for bundle in doomed:
        reason = ("least recently used" if bundle.key in plan.evicted_bundles
                  else "its image is no longer cached" if bundle.manifest is not None
                  else "made from an unknown image")
        removed.append(Removal("bundle", bundle.key, plan.footprint.drop(bundle.path), reason))
    live_snapshots = plan.live_snapshots()
    for snapshot in plan.snapshots:
        if snapshot.chain_id in live_snapshots:
            continue
        if not dry_run:
            remove_snapshot(store, snapshot.chain_id)
        reason = ("least recently used" if snapshot.chain_id in plan.evicted_snapshots
                  else "no cached image has these layers")
        removed.append(Removal("snapshot", str(snapshot.chain_id),
                               plan.footprint.drop(snapshot.path), reason))
    live_blobs = plan.live_blobs()
    for digest, blob in sorted(plan.blobs.items()):
        if digest in live_blobs:
            continue
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(blob.path)
        removed.append(Removal("blob", str(digest), plan.footprint.drop(blob.path),
                               "no cached image uses it"))
    removed.extend(_forget_stale_usage(store, {r.digest.hex for r in plan.kept_refs()},
                                       live_bundles, {b.key for b in doomed}, plan.started,
                                       plan.footprint, dry_run))
    return removed


def _forget_stale_usage(store: Store, manifests: set[str], bundles: set[str], doomed: set[str],
                        started: float, footprint: Footprint, dry_run: bool) -> list[Removal]:
    """Drop last-use records of removed bundles and of gone entries (not those a running
    command touched since)."""
    removed: list[Removal] = []
    for (kind, key), used in usage.all_usage(store.root).items():
        if used >= started and not (kind == "bundle" and key in doomed):
            continue
        if (kind == "image" and key not in manifests) or (kind == "bundle" and key not in bundles):
            usage_kind: usage.UsageKind = "image" if kind == "image" else "bundle"
            if not dry_run:
                usage.forget(store.root, usage_kind, key)
            size = footprint.drop(usage.usage_path(store.root, usage_kind, key))
            removed.append(Removal("usage", f"{kind}-{key}", size, "its entry is gone"))
    return removed


# -- the entry points --------------------------------------------------------------------------

def collect(store: Store, options: GcOptions | None = None,
            job_states: JobStates = squeue_states, now: float | None = None) -> GcReport:
    """Run one GC over ``store`` (see the module docstring); returns what it removed."""
    options = options or GcOptions()
    now = time.time() if now is None else now
    lock = FileLock(store.root / GC_LOCK, heartbeat=1.0)
    if not options.dry_run:
        timeout = options.lock_timeout
        try:
            lock.acquire(timeout=timeout)
        except LockTimeout as exc:
            raise LockTimeout(f"another `ocistage cache gc` is running on {store.root}",
                              "wait for it to finish, or retry later") from exc
    try:
        return _collect(store, options, job_states, now)
    finally:
        if not options.dry_run:
            lock.release()


def _collect(store: Store, options: GcOptions, job_states: JobStates, now: float) -> GcReport:
    started = time.time()
    footprint = measure(store.root, skip=(GC_LOCK,))
    size_before = footprint.size()
    removed = _leftovers(store, options.dry_run, now, footprint)
    leases = all_leases(store.root)
    states = job_states_of(leases, job_states)
    expired, live = _expire(store, leases, states, options.dry_run, footprint)
    removed.extend(expired)
    plan = _Plan(refs=read_refs(store), blobs=list_blobs(store), bundles=list_bundles(store),
                 snapshots=list_snapshots(store), protected=live | set(options.keep),
                 footprint=footprint, started=started)
    protected_refs = {t.removeprefix("image:") for t in plan.protected if t.startswith("image:")}
    plan.protected |= {ref.target for ref in plan.refs if ref.name in protected_refs}
    kept: list[str] = []
    if options.max_size is not None or options.older_than is not None:
        kept = _evict(plan, store, options, now)
    removed.extend(_apply(plan, store, options.dry_run))
    return GcReport(removed=tuple(removed), protected=tuple(dict.fromkeys(kept)),
                    size_before=size_before, size_after=plan.size(),
                    max_size=options.max_size, dry_run=options.dry_run,
                    size_floor=footprint.floor())


def remove_ref(store: Store, name: str, platform: str | None = None, force: bool = False,
               job_states: JobStates = squeue_states) -> GcReport:
    """``cache rm``: drop ref ``name`` (one ``platform``, ``os/arch[/variant]``, or all) and
    at once everything only it used, as a GC without eviction does.

    A ref that a live lease names is refused unless ``force``; even then, leased blobs and
    bundles stay until their lease ends (a later GC removes them).
    """
    def wanted(ref: Ref) -> bool:
        return ref.name == name and (platform is None or ref.platform == platform
                                     or ref.platform.startswith(platform + "/"))

    lock = FileLock(store.root / GC_LOCK, heartbeat=1.0)
    lock.acquire(timeout=GcOptions().lock_timeout)
    try:
        refs = [ref for ref in read_refs(store) if wanted(ref)]
        if not refs:
            raise NotFound(f"{name}{' for ' + platform if platform else ''} is not in the cache",
                           "`ocistage cache ls` lists the cached images")
        leases = [lease for lease in all_leases(store.root) if f"image:{name}" in lease.targets]
        states = job_states_of(leases, job_states)
        holders = [lease.holder.describe() for lease in leases if is_live(lease, states)]
        if holders and not force:
            raise StoreError(f"{name} is in use ({', '.join(holders)})",
                             "wait until it is released, or pass --force to drop the ref "
                             "anyway (leased content stays until its lease ends)")
        store.untag(lambda entry: any(ref.same_entry(entry) for ref in refs))
        report = _collect(store, GcOptions(), job_states, time.time())
    finally:
        lock.release()
    dropped = tuple(Removal("ref", f"{r.name} ({r.platform})" if r.platform else r.name, 0,
                            "removed on request") for r in refs)
    return GcReport(removed=dropped + report.removed, protected=report.protected,
                    size_before=report.size_before, size_after=report.size_after,
                    max_size=None, dry_run=False, size_floor=report.size_floor)


def enforce_budget(store: Store, max_size: int, keep: Iterable[str] = (),
                   job_states: JobStates = squeue_states) -> tuple[str, ...]:
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
        return (f"the cache holds {format_size(report.size_after)}, over its budget of "
                f"{format_size(max_size)}: the rest is in use or leased",)
    return ()
