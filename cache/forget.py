"""Forget one ref: untag it and unlink the blobs only it reached, under the GC lock, and do
nothing else a ``cache gc`` does.

The importer's squashfs-only store (docs/pyxis.md, "What an image costs") drops what its get
pulled once the squashfs is made. A whole :func:`ocistage.cache.gc.remove_ref` (leftovers,
lease expiry, the eviction plan, usage records) is more than that needs: :func:`forget` does
the one removal, as the lease protocol of :mod:`ocistage.cache.leases` asks of any remover.
Holding ``CACHE/gc.lock`` it

1. reads the leases once: a live one naming ``image:<name>`` keeps everything (nothing is
   done), and every blob a live lease names (``blob:<digest>``) stays;
2. reads index.json once: what the ref's records reach and what the other records reach
   (:func:`ocistage.cache.inventory.reached_only_by`: manifests or indexes, configs, layers,
   the indexes they were chosen from and those their aliases name);
3. untags the ref (:meth:`~ocistage.cache.store.Store.untag`: its records of every
   platform, and its alias) and unlinks the blobs only it reached that no live lease names.
   A blob that cannot be unlinked (another member's, where the cache's directory does not
   let this user) is left: the next ``cache gc`` removes orphans.

A command that starts using content records its lease and then waits for no GC lock to be held
before it looks (:meth:`~ocistage.cache.leases.InUse.protect`): it was either seen in 1, or it
looks once the removal is over (and pulls again what is gone). A pull tags only under its
lease, so a ref tagged after 2 read the index uses only blobs that a lease seen in 1 names.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ocistage.cache.digest import Digest
from ocistage.cache.inventory import reached_only_by
from ocistage.cache.leases import GC_LOCK, JobStates, live_targets, squeue_states
from ocistage.cache.locks import FileLock
from ocistage.cache.refnames import record_name
from ocistage.cache.store import Store


@dataclass(frozen=True)
class Forgotten:
    """What :func:`forget` did: how many records it untagged, the blobs it unlinked."""

    records: int = 0
    blobs: tuple[Digest, ...] = ()
    leased: bool = False    # a live lease named the ref: nothing was done


def forget(store: Store, name: str, lock_timeout: float | None = 10.0,
           job_states: JobStates = squeue_states) -> Forgotten:
    """Drop ref ``name`` (every platform) and the blobs only it used (module docstring);
    nothing while a live lease names it. A LockTimeout once a GC has held the cache for
    ``lock_timeout`` seconds (None: wait as long as it does)."""
    lock = FileLock(store.root / GC_LOCK, heartbeat=1.0)
    lock.acquire(timeout=lock_timeout)
    try:
        held = live_targets(store.root, ("image", "blob"), job_states)
        if f"image:{name}" in held:
            return Forgotten(leased=True)
        doomed = reached_only_by(store, store.read_index(), name)
        untagged = store.untag(lambda entry: record_name(entry) == name)
        gone = []
        for digest in sorted(doomed) if untagged else ():
            if f"blob:{digest}" in held:
                continue
            with contextlib.suppress(FileNotFoundError, PermissionError):
                store.blob_path(digest).unlink()
                gone.append(digest)
        return Forgotten(len(untagged), tuple(gone))
    finally:
        lock.release()
