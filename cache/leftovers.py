"""GC's first step: the leftovers of dead processes and what was set aside long ago.

Temp dirs, bundles being built, partial downloads nobody is downloading, stale lock files (those
of dead owners); temp files of atomic writes and ownerless temp dirs (a removal that was
interrupted) older than :data:`LEFTOVER_TEMP_AGE`; quarantined entries older than
:data:`QUARANTINE_KEEP`; trees evicted earlier (:mod:`ocistage.cache.evict`). What another
member of a group-shared cache owns is left to it and reported
(:class:`~ocistage.cache.evict.Left`).
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ocistage.cache.builddirs import scratch_is_dead
from ocistage.cache.evict import Left, evicted_in, is_evicted, may_remove, owner_of, remove_evicted
from ocistage.cache.inventory import bundle_scratch_dirs
from ocistage.cache.locks import FileLock, owner_is_dead
from ocistage.cache.owneddirs import OWNER_SUFFIX, owner_file
from ocistage.cache.store import QUARANTINE, Store
from ocistage.cache.sweep import Removal, Sweep, take_out_tree

LEFTOVER_TEMP_AGE = 3600.0
QUARANTINE_KEEP = 7 * 86400.0


@dataclass(frozen=True)
class Quarantined:
    """An entry of ``CACHE/quarantine``: kept a week for a post-mortem, or less when the cache
    is over its budget (it goes first: nothing uses it)."""

    path: Path
    when: float      # its mtime (``cache gc`` removes it a week later)

    @property
    def target(self) -> str:
        return f"quarantine:{self.path.name}"  # no lease names it


def sweep_leftovers(sweep: Sweep[Removal], store: Store, now: float) -> None:
    """Remove (or, in a dry run, list) the leftovers the module docstring names."""
    _dead_scratch(sweep, store, now)
    _dead_partials(sweep, store)
    _interrupted_removals(sweep, store, now)
    _interrupted_writes(sweep, store, now)
    _old_quarantine(sweep, store, now)
    _evicted_trees(sweep, store)


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
            take_out_tree(sweep, "scratch", str(path), "bundle build of a dead process", path)


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
                take_out_tree(sweep, "scratch", str(path), "removal interrupted by a crash", path)


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
            take_out_tree(sweep, "quarantine", str(entry.path), "quarantined more than a week ago",
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

