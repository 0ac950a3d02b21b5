"""GC's second step: dead leases are dropped, and a staged bundle all of whose leases are dead is
removed when its marker names one of them (then its leases are dropped).

A staged bundle's leases are grouped by its place under every spelling
(:func:`ocistage.cache.leases.staged_groups`); the removal is
:func:`ocistage.cache.targetlayout.remove`. A removal that fails (a busy mount) keeps the leases,
so the next GC tries again.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path

from ocistage.cache import targetlayout
from ocistage.cache.errors import StoreError
from ocistage.cache.leases import Lease, is_live, release, staged_groups
from ocistage.cache.store import Store
from ocistage.cache.sweep import Removal, Sweep
from ocistage.cache.treesize import tree_size

log = logging.getLogger(__name__)


def expire_leases(sweep: Sweep[Removal], store: Store, leases: list[Lease],
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

