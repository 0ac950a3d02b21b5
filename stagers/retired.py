"""Replaced versions: retired, kept while a job may still run on them, else handed to a remover.

A re-stage of a changed source publishes the new version of ``TO/NAME`` by an exchange, and
the replaced version used to be removed at once. But a job that started a container on it
(runc bind-mounts ``rootfs/`` when the container starts) goes on reading the replaced tree
after the switch: removing it would pull its files from under the running job — worse than
``rsync``'s mix of two versions. So when a live holder of ``TO/NAME`` other than the stager
itself — a Slurm job (asked with ``squeue``; one that Slurm cannot be asked about counts as
live), or a process — holds a lease on it, the replaced version is *retired* instead:

- one lease per such holder is taken on ``staged:TO/.ocistage-retired-NAME.<hex>`` (before the
  rename: a crash leaves leases on a path that is gone, which ``cache gc`` drops), the version
  is renamed there (a reserved name: no staged name starts with ``.ocistage``), and its marker
  is rewritten to name the first of those leases, so ``cache gc`` removes it like any staged
  bundle once those leases are all dead;
- the next stage of ``NAME`` (under its lock) and ``unstage NAME`` remove the retired versions
  of ``NAME`` that no live lease holds any more; ``unstage`` releases the caller's leases on
  them first (without a holder: every lease, and with ``--force`` they go whoever holds them).

The stager's own holder counts only if it held ``NAME`` before this stage. Pins do not keep a
retired version: a pin (``stage:USER`` outside a job) is held until
``unstage`` and names no running process, so it would keep every version ever replaced.
Only the stager's own cache's leases are seen: jobs of other users that run a bundle staged
by you are not known to it.

A replaced version that no such holder may run on is retired too, and removed by a detached
remover (:func:`retire_for_removal`, :mod:`ocistage.stagers.remover`) so that the stage returns
at once: the remover is started first (:mod:`ocistage.stagers.detach`), a lease of the remover
process (its id starts with :data:`REMOVER_LEASE`) is taken on the retired path, the version
is renamed there and its marker rewritten to name that lease, and only then is the remover
told to go. While the remover lives, nobody else touches that version (:func:`sweep` skips
it; ``cache gc`` sees a live lease). A remover killed at any point (``SIGKILL``, the cgroup
of a Slurm step) leaves a retired, partly removed version with a dead lease, its marker kept
to the last (:func:`ocistage.cache.targetlayout.remove`): the next ``stage`` or ``unstage`` of
``NAME``, ``cache gc``, or :func:`finish_retired` (a job's own cleanup of a node-local target)
removes the rest.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from ocistage.cache import leases, targetlayout
from ocistage.cache.dirfds import DIR_FOLLOW
from ocistage.cache.dirtrust import trust_problem
from ocistage.cache.leases import Holder, Lease, StagedPlace
from ocistage.cache.targetlayout import RETIRED_PREFIX
from ocistage.cache.treeremoval import remove_tree
from ocistage.errors import OcistageError
from ocistage.stagers import detach
from ocistage.stagers.markers import (
    Claim,
    live_leases,
    marker_of,
    release_leases,
    staged_leases,
    write_at,
)
from ocistage.stagers.removal import remove_subtrees

log = logging.getLogger(__name__)

#: the id of a remover's lease on the version it removes starts with this
REMOVER_LEASE = "remover-"


def retired_path(to: Path, name: str) -> Path:
    """A new path for a retired version of ``name`` in ``to``."""
    return to / f"{RETIRED_PREFIX}{name}.{uuid.uuid4().hex[:10]}"


def users(claim: Claim) -> list[Lease]:
    """The live leases on the claimed path whose holders may run on its current version: Slurm
    jobs and processes, not pins; this staging's own lease only if it held the path before."""
    own = claim.lease
    found = [lease for lease in staged_leases(claim.cache_root, claim.path)
             if lease.holder.kind != "pin" and not (claim.taken and lease.id == own.id)]
    return live_leases(found)


def retire(replaced: Path, claim: Claim, holders: Iterable[Holder]) -> Path:
    """Move the replaced version ``replaced`` of the claimed path aside, held by ``holders``;
    returns where it now is (see the module docstring)."""
    final = claim.path
    aside = retired_path(final.parent, final.name)
    place = StagedPlace.of(aside, local=claim.local)  # a node's copy: its versions too
    taken = [place.acquire(claim.cache_root, holder) for holder in holders]
    _move_aside(replaced, aside, taken[0].id if taken else None)
    return aside


def _move_aside(replaced: Path, aside: Path, lease_id: str | None) -> None:
    """Rename ``replaced`` to ``aside`` and make its marker name ``lease_id``."""
    os.rename(replaced, aside)
    fd = os.open(aside, DIR_FOLLOW)
    try:
        marker = marker_of(targetlayout.read_json_at(fd, targetlayout.MARKER_NAME))
        if marker is not None and lease_id is not None:
            write_at(fd, targetlayout.MARKER_NAME, replace(marker, id=lease_id).to_json())
    finally:
        os.close(fd)


def retire_for_removal(replaced: Path, claim: Claim,
                       remover: detach.Detached | None = None) -> bool:
    """Retire the replaced version ``replaced`` of the claimed path and hand it to a detached
    remover (module docstring): ``remover`` if one was started already, else a new one. False
    if no remover could be started (nothing was moved: the caller removes it)."""
    remover = remover or detach.spawn()
    if remover is None:
        return False
    final = claim.path
    aside = retired_path(final.parent, final.name)
    try:
        place = StagedPlace.of(aside)
        lease = Lease(id=f"{REMOVER_LEASE}{uuid.uuid4().hex}", target=place.target,
                      holder=remover.holder, created=time.time(), identity=place.identity)
        leases.record(claim.cache_root, lease)
        _move_aside(replaced, aside, lease.id)
    except BaseException:
        remover.cancel()
        raise
    if not remover.go({"cache": str(claim.cache_root), "path": str(aside), "lease": lease.id}):
        remove_retired(aside, claim.cache_root, lease.id)  # it died: do it here
    return True


def is_remover(lease: Lease) -> bool:
    """Whether ``lease`` is a remover's on the version it removes."""
    return lease.id.startswith(REMOVER_LEASE)


def retired_versions(to: Path, name: str | None) -> list[Path]:
    """The retired versions of ``name`` (of every name, if None) in ``to``: directories of
    that name's pattern that are ours (:func:`ocistage.cache.dirtrust.trust_problem`), and the
    paths of those whose removal left only the outer marker beside them (a file of ours). In a
    sticky target a co-tenant can plant anything under such a name (a directory of theirs, a
    symlink): that is not ours to sweep, and failing on it would let them stop every stage of
    ``name``."""
    stem = re.escape(RETIRED_PREFIX + name) if name is not None else re.escape(
        RETIRED_PREFIX) + ".+"
    pattern = re.compile(stem + r"\.[0-9a-f]{10}")
    outer = re.compile(r"\.(" + stem + r"\.[0-9a-f]{10})" + re.escape(targetlayout.MARKER_NAME))
    try:
        entries = os.listdir(to)
    except OSError:
        return []
    found: dict[str, Path] = {}
    for entry in sorted(entries):
        beside = outer.fullmatch(entry)
        if not pattern.fullmatch(entry) and beside is None:
            continue
        try:
            st = os.lstat(to / entry)
        except FileNotFoundError:
            continue
        if beside is not None and stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            found.setdefault(beside.group(1), to / beside.group(1))
        elif beside is None and stat.S_ISDIR(st.st_mode) and trust_problem(st) is None:
            found[entry] = to / entry
    return sorted(found.values())


def finish_retired(to: Path, cache_root: Path, name: str | None = None) -> int:
    """Remove what is left of the retired versions in the target ``to`` (of ``name``, or of
    every name) that no live lease holds and no live remover is removing: those of a remover
    killed mid-way, of jobs that have ended. Only the caller's own are looked at; returns how
    many were removed. What the next ``stage`` and ``unstage`` of a name do, and what a job's
    own cleanup of a node-local target, which may never see another command, calls."""
    return sweep(to, name, cache_root)


def sweep(to: Path, name: str | None, cache_root: Path, *, holder: Holder | None = None,
          release: bool = False, force: bool = False) -> int:
    """Remove the retired versions of ``name`` (every name: None) that no live lease holds;
    returns how many. One that a live remover is removing is left to it, whatever else is
    asked (it is going anyway).

    ``release``: first release ``holder``'s leases on them (every lease when ``holder`` is
    None), as ``unstage`` does; ``force``: remove them whoever holds them. Pool entries only
    they linked to are released after.
    """
    removed = 0
    for path in retired_versions(to, name):
        if any(is_remover(lease) for lease in live_leases(staged_leases(cache_root, path))):
            continue
        if force or release:
            remaining = release_leases(cache_root, path, None if force else holder)
        else:
            remaining = staged_leases(cache_root, path)
        if live_leases(remaining):
            continue
        try:
            _remove(path)
        except (OSError, OcistageError) as exc:  # e.g. a file a job made that is not ours:
            # never a reason to fail the stage or unstage at hand; its leases stay, so the
            # next sweep and cache gc try again (and gc reports it)
            log.warning("cannot remove the retired version %s yet: %s", path, exc)
            continue
        for lease in remaining:
            leases.release(cache_root, lease.id)
        removed += 1
    if removed:
        targetlayout.sweep_pool(to)
    return removed


def _remove(path: Path) -> None:
    """Remove a retired version, its marker last (:func:`ocistage.cache.targetlayout.take_down`),
    then the outer marker beside it, if a remover wrote one: one that stops half-way stays
    recognisable to ``cache gc`` and the next sweep."""
    bundle = targetlayout.open_staged(path)
    if bundle is None:  # no marker (a crash between the rename and the marker's rewrite)
        remove_tree(path)
        return
    try:
        targetlayout.take_down(bundle)
        targetlayout.drop_outer_marker(bundle)
    finally:
        os.close(bundle.parent_fd)


def remove_retired(path: Path, cache_root: Path, lease_id: str, processes: int = 1) -> None:
    """Remove the retired version at ``path`` as the holder of lease ``lease_id`` on it (the
    remover), then every lease on it: the outer marker beside it names that lease first, its
    subtrees go in ``processes`` forked workers, its marker last (as
    :func:`ocistage.cache.targetlayout.remove` does), so a removal killed at any point leaves
    what ``cache gc`` and :func:`sweep` finish. Then the target's pool is swept of entries no
    bundle links any more (the whole pool: what the stage that replaced the version found only
    it used is not enough, when other versions of the name are removed or unstaged meanwhile)."""
    bundle = targetlayout.open_staged(path)
    if bundle is None:  # no marker (a crash between the rename and the marker's rewrite)
        remove_tree(path)
    else:
        try:
            if not bundle.remnant:
                targetlayout.mark_removing(bundle, lease_id)
                if processes > 1 and not bundle.mounted:
                    remove_subtrees(bundle.fd, processes)
            targetlayout.take_down(bundle)
            if bundle.marker.get("method") == "pool":
                targetlayout.sweep_pool(path.parent)
            targetlayout.drop_outer_marker(bundle)
        finally:
            os.close(bundle.parent_fd)
    for lease in staged_leases(cache_root, path):
        leases.release(cache_root, lease.id)
