"""GC's second step: dead leases are dropped, and a staged bundle all of whose leases are dead is
removed when its marker names one of them (then its leases are dropped).

A staged bundle's leases are grouped by its place under every spelling
(:func:`ocistage.cache.leases.staged_groups`); the removal is
:func:`ocistage.cache.targetlayout.remove`. A removal that fails (a busy mount) keeps the leases,
so the next GC tries again.

A node-local copy (``stage --all-nodes``: its leases record their node) is removed only by a GC
on that node: elsewhere its path leads to another node's directory, or to nothing. So a GC on
any other host (a login node) keeps the dead leases of a copy on another node and reports it
in :attr:`~ocistage.cache.gc.GcReport.left` (the job's own cleanup job on that node, or a GC
there, removes the copy and drops them). A node that never comes back would keep them for
ever: they are dropped once the newest of them is :data:`NODE_COPY_KEEP` old (the copy, should
the node return, is then no longer leased: a later stage of its name there replaces it).
"""

from __future__ import annotations

import logging
import os
import time
from functools import partial
from pathlib import Path

from ocistage.cache import targetlayout
from ocistage.cache.errors import StoreError
from ocistage.cache.evict import Left
from ocistage.cache.leases import Lease, is_live, release, staged_groups
from ocistage.cache.nodes import this_node
from ocistage.cache.store import Store
from ocistage.cache.sweep import Removal, Sweep
from ocistage.cache.treesize import tree_size

log = logging.getLogger(__name__)

#: how long the dead leases of a copy on another node are kept, counted from the newest one's
#: creation (longer than most jobs run: the job ended, and its node's cleanup did not come)
NODE_COPY_KEEP = 14 * 86400.0


def expire_leases(sweep: Sweep[Removal], store: Store, leases: list[Lease],
                  states: dict[str, str] | None, now: float | None = None,
                  here: str | None = None) -> set[str]:
    """Drop dead leases (staged bundles included); return the live targets. ``here``: the
    node this GC runs on (:func:`ocistage.cache.nodes.this_node`)."""
    now = time.time() if now is None else now
    here = this_node() if here is None else here
    live: set[str] = set()
    staged_leases: list[Lease] = []
    for lease in leases:
        if lease.target.startswith("staged:") and not lease.also:
            staged_leases.append(lease)
        elif is_live(lease, states):
            live.update(lease.targets)
        else:
            _drop_lease(sweep, store, lease, "holder is gone")
    for group in staged_groups(staged_leases, here):  # one bundle, whatever the spellings
        node = elsewhere(group, here)
        if any(is_live(lease, states) for lease in group):
            live.update(lease.target for lease in group)
        elif node:
            _leave_to_node(sweep, store, group, node, now)
        else:
            _expire_staged(sweep, store, group)
    return live


def elsewhere(group: list[Lease], here: str) -> str:
    """The node whose own copy a group of :func:`staged_groups` holds, if it is not ``here``
    (the group's leases all record it); "" for a copy this GC can reach."""
    nodes = {lease.node for lease in group}
    node = next(iter(nodes)) if len(nodes) == 1 else ""
    return node if node != here else ""


def _leave_to_node(sweep: Sweep[Removal], store: Store, leases: list[Lease], node: str,
                   now: float) -> None:
    """The dead leases of a copy on another ``node``: kept and reported (left to that node's
    cleanup), or dropped once :data:`NODE_COPY_KEEP` has passed (module docstring)."""
    path = leases[0].target.removeprefix("staged:")
    if now - max(lease.created for lease in leases) > NODE_COPY_KEEP:
        days = NODE_COPY_KEEP / 86400
        for lease in leases:
            _drop_lease(sweep, store, lease, f"dead lease of a copy on node {node}, which has "
                                             f"not removed it in {days:.0f} days")
        return
    try:
        owner = (store.root / "leases" / f"{leases[0].id}.json").stat().st_uid
    except OSError:
        owner = os.geteuid()
    sweep.leave(Left("staged", f"{path} on node {node}", owner,
                     "its job has ended; the job's cleanup on that node (or `ocistage cache "
                     "gc` there) removes it, and this gc keeps its lease until then"))


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

