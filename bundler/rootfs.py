"""A bundle's ``rootfs/``, made in its scratch directory: cloned from the image's snapshot, or
unpacked straight into it while the layers download.

The snapshot (:mod:`ocistage.cache.snapshots`) is found in the cache, or built first on the longest
cached prefix of the image's layers (an image sharing base layers with a cached one only
unpacks its new layers). The rootfs is then a hard-linked clone of it (``link``: new
directories, shared file inodes) or an independent copy (``cp -a --reflink=auto``, with the
image's modes of the files the snapshot keeps owner-readable: :mod:`ocistage.cache.snapshotmodes`,
so a user copies a ``000`` file of its own without a race on the shared snapshot). A writable
bundle whose snapshot is not cached, where a copy from the cache would be no reflink, is
unpacked straight into the scratch directory and no snapshot is kept (``keep_snapshot``
forces one): :func:`_copy_from_snapshot` says why.

A rootfs with the image's owners (:attr:`RootfsJob.owners`: ``bundle --no-rootless`` run by
root) is always unpacked straight into the scratch directory, never cloned from or kept as a
snapshot: snapshots hold the trees of rootless unpacks, whose files belong to the user who
made them, and are shared by every bundle of their layers, rootless or not. A snapshot of
owned files would hand the image's owners to rootless bundles (files of host uids the caller
cannot write), and a rootless snapshot to an owned bundle is what left its image user unable
to write its own HOME (issue 27).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from ocistage.bundler.follower import StreamRestarted
from ocistage.bundler.image.manifest import Descriptor
from ocistage.bundler.unpack.layerchain import AppliedLayers, apply_layers
from ocistage.cache.digest import Digest
from ocistage.cache.errors import StoreError
from ocistage.cache.leases import InUse
from ocistage.cache.linkprobes import hardlinks_work, reflinks_work
from ocistage.cache.owneddirs import release_owned_dir
from ocistage.cache.snapshotmodes import keep_owner_readable, read_modes, restore_modes
from ocistage.cache.snapshots import METADATA as SNAPSHOT_METADATA
from ocistage.cache.snapshots import (
    SnapshotUnreadable,
    chain_ids,
    copy_tree,
    find_snapshot,
    lease_target,
    link_tree,
    publish_snapshot,
    snapshot_warnings,
    strip_for_group,
)
from ocistage.cache.store import Store
from ocistage.cache.treeremoval import remove_tree
from ocistage.cache.unpackbudget import UnpackBudget, default_unpack_limit
from ocistage.errors import OcistageError


class Downloads(Protocol):
    """The image's layers while its pull runs (:class:`ocistage.bundler.follower.PullThread`)."""

    def open(self, digest: Digest) -> BinaryIO:
        """A layer's bytes, following its download."""
        ...

    def restarted(self) -> bool:
        """Whether any download started over (bytes a reader saw may have been dropped)."""
        ...

    def result(self) -> object:
        """Wait until the pull verified every blob; raise its error if it failed."""
        ...


@dataclass(frozen=True)
class RootfsJob:
    """The layers a rootfs is made of and where they come from: the verified blobs of
    ``store`` and the ``downloads`` still running; ``in_use`` leases the snapshots used."""

    store: Store
    in_use: InUse
    downloads: Downloads
    layers: tuple[Descriptor, ...]
    diff_ids: tuple[Digest, ...]
    unpack_limit: int | None = None  # file data it may unpack (None: by the layers' size)
    on_layer: Callable[[int, Descriptor], None] | None = None  # before layer n is unpacked
    owners: bool = False  # the image's owners and device nodes (root only), no snapshot


def make_rootfs(job: RootfsJob, scratch: Path, *, link: bool,
                keep_snapshot: bool) -> tuple[AppliedLayers, Path | None, bool]:
    """Make ``scratch/rootfs`` of the image; return what was unpacked, the snapshot the rootfs
    links to (None: a private tree) and whether it is linked (a link can fall back to a copy).
    """
    rootfs = scratch / "rootfs"
    snapshot: Path | None = None
    if job.owners:  # never through a snapshot: see the module docstring
        return _unpack(job, rootfs), None, False
    base, cached = _cached_prefix(job.store, job.in_use, job.diff_ids)
    if base is None and cached < 0:  # another member's snapshot we may not read: our own tree
        return _unpack(job, rootfs), None, False
    if link or keep_snapshot or _copy_from_snapshot(cached == len(job.layers), job.store,
                                                    scratch):
        snapshot, applied = _snapshot(job, base, cached)
        # another mount point of the same filesystem refuses links (EXDEV): copy then
        link = link and hardlinks_work(snapshot.parent / SNAPSHOT_METADATA, scratch)
        try:
            if link:
                link_tree(snapshot, rootfs)
            else:
                _copy_snapshot(snapshot, rootfs)
        except StoreError:
            # cp cannot clone every tree (a path longer than PATH_MAX): the verified
            # layers are unpacked again, through descriptors, straight into the bundle
            remove_tree(rootfs)
            rootfs.mkdir(mode=0o755)
            applied = apply_layers(job.store.open_blob, job.layers, job.diff_ids, rootfs,
                                   on_layer=job.on_layer)
            link = False
        if not link:
            snapshot = None  # a private copy: it shares nothing with the cache
    else:
        applied = _unpack(job, rootfs)
    return applied, snapshot, link


def _unpack(job: RootfsJob, rootfs: Path, *, first: int = 1,
            base: Path | None = None) -> AppliedLayers:
    """Apply the layers from number ``first`` on onto a new ``rootfs`` (empty, or a linked
    clone of ``base``) while they download; if a download had to start over, again from the
    verified blobs."""

    def prepare() -> None:
        if base is not None:
            link_tree(base, rootfs)  # applying layers never writes into linked files
        else:
            rootfs.mkdir(mode=0o755)

    layers, diff_ids = job.layers[first - 1:], job.diff_ids[first - 1:]
    limit = job.unpack_limit
    if limit is None:
        limit = default_unpack_limit(sum(layer.size for layer in layers))
    prepare()
    rootless = not job.owners
    try:
        return apply_layers(job.downloads.open, layers, diff_ids, rootfs, first=first,
                            on_layer=job.on_layer, budget=UnpackBudget(limit),
                            rootless=rootless)
    except (StreamRestarted, OcistageError):
        # Bytes that fail to unpack may be a bad download that the pull is retrying: the
        # pull's verdict comes first, and a layer whose download started over is unpacked
        # again from its verified blob.
        job.downloads.result()
        if not job.downloads.restarted():
            raise
        remove_tree(rootfs)
        prepare()
        return apply_layers(job.store.open_blob, layers, diff_ids, rootfs, first=first,
                            on_layer=job.on_layer, budget=UnpackBudget(limit),
                            rootless=rootless)


def _copy_snapshot(snapshot: Path, rootfs: Path) -> None:
    """``rootfs`` a private copy of ``snapshot`` with the image's modes: the files kept
    owner-readable in the snapshot get theirs back (:mod:`ocistage.cache.snapshotmodes`)."""
    copy_tree(snapshot, rootfs)
    restore_modes(rootfs, read_modes(snapshot.parent) or ())


def _copy_from_snapshot(complete: bool, store: Store, scratch: Path) -> bool:
    """Whether a writable bundle (in ``scratch``) is copied from the image's snapshot rather
    than unpacked from the blobs: when the snapshot of all its layers is cached
    (``complete``: a copy costs a fraction of an unpack), or when a copy from the cache to
    ``scratch`` is a reflink (the snapshot kept for later bundles then costs no more than the
    unpack itself). Otherwise keeping a snapshot would write the tree twice: measured, +26% on
    a cold bundle on ext4, +11% on tmpfs and twice the memory there (docs/performance.md), so
    the bundle is unpacked straight into ``scratch`` and no snapshot is kept."""
    return complete or reflinks_work(store.tmp_dir, scratch)


def _cached_prefix(store: Store, in_use: InUse,
                   diff_ids: tuple[Digest, ...]) -> tuple[Path | None, int]:
    """The rootfs of the longest cached snapshot of the image's layers and how many layers it
    holds (None, 0: none; None, -1: the snapshot of all of them is another member's that the
    caller may not read, so one of its own could not be published either). The snapshots
    are leased first, so GC leaves what is found."""
    chain = chain_ids(diff_ids)
    in_use.protect([lease_target(c) for c in chain])
    for depth in range(len(chain), 0, -1):
        try:
            base = find_snapshot(store, chain[depth - 1])
        except SnapshotUnreadable:
            if depth == len(chain):
                return None, -1
            continue
        if base is not None:
            return base, depth
    return None, 0


def _snapshot(job: RootfsJob, base: Path | None, cached: int) -> tuple[Path, AppliedLayers]:
    """The snapshot of all the layers: ``base`` when it holds all of them (``cached``), else
    built on it (:func:`_cached_prefix`)."""
    chain = chain_ids(job.diff_ids)
    inherited = snapshot_warnings(base) if base is not None else ()
    if base is not None and cached == len(chain):
        return base, AppliedLayers(0, 0, inherited)
    store = job.store
    work = store.temp_dir("snapshot")
    try:
        applied = _unpack(job, work / "rootfs", first=cached + 1, base=base)
        job.downloads.result()  # every blob verified before the snapshot is published
        stripped = strip_for_group(store, work / "rootfs")
        applied = dataclasses.replace(applied, warnings=inherited + applied.warnings + stripped)
        modes = keep_owner_readable(work / "rootfs", base, unreadable=applied.unreadable > 0,
                                    links=applied.links > 0)
        published = publish_snapshot(store, work, chain[-1], job.diff_ids, applied.entries,
                                     applied.warnings, modes)
    except BaseException:
        with contextlib.suppress(OSError):
            store.remove_temp_dir(work)
        raise
    with contextlib.suppress(OSError):
        release_owned_dir(work)
    return published, applied
