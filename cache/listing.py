"""What ``cache ls`` shows: the cached images, bundles and importer images with their sizes,
last use and leases, and the staged bundles (:func:`listing`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ocistage.cache import usage
from ocistage.cache.digest import Digest
from ocistage.cache.inventory import (
    Bundle,
    Ref,
    bundle_last_used,
    list_blobs,
    list_bundles,
    read_refs,
    ref_last_used,
)
from ocistage.cache.leases import (
    JobStates,
    Lease,
    all_leases,
    is_live,
    job_states_of,
    squeue_states,
)
from ocistage.cache.pyxisimages import list_images
from ocistage.cache.sizes import format_age, format_size
from ocistage.cache.store import Store
from ocistage.cache.treesize import tree_shares

if TYPE_CHECKING:
    from ocistage.results import Renderer


@dataclass(frozen=True)
class LeaseRow:
    id: str
    target: str
    holder: str
    created: float
    live: bool
    node: str = ""            # of a node-local copy: the node whose copy it holds


@dataclass(frozen=True)
class ImageRow:
    name: str
    platform: str
    digest: str
    resolved: str | None
    last_used: float
    size: int                 # bytes of the blobs it reaches
    unique_size: int          # bytes of the blobs no other ref reaches
    missing: tuple[str, ...]  # blobs it reaches that are not in the cache
    bundles: tuple[str, ...]  # keys of cached bundles made from it
    leases: tuple[LeaseRow, ...]


@dataclass(frozen=True)
class BundleRow:
    key: str
    image: str | None
    manifest: str | None
    last_used: float
    disk: int                 # bytes on disk of its tree, each inode once
    unique: int               # of those, what only it holds (what removing it frees)
    orphan: bool              # no ref names its manifest any more
    names: tuple[str, ...]    # the refs that name its manifest now (it is kept for each)
    leases: tuple[LeaseRow, ...]


@dataclass(frozen=True)
class SquashfsRow:
    """A squashfs image of ``ocistage-pyxis-importer`` (:mod:`ocistage.cache.pyxisimages`)."""

    key: str
    source: str | None
    last_used: float
    disk: int
    leases: tuple[LeaseRow, ...]


@dataclass(frozen=True)
class Listing:
    images: tuple[ImageRow, ...]
    bundles: tuple[BundleRow, ...]
    leases: tuple[LeaseRow, ...]   # every lease, including those on staged bundles
    squashfs: tuple[SquashfsRow, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """What ``cache ls --json`` prints: every field, as it is."""
        return dataclasses.asdict(self)

    def render(self, out: Renderer) -> None:
        """Four tables: images, cached bundles, importer images, staged bundles (the last three
        if any)."""
        out.table(["DIGEST", "PLATFORM", "SIZE", "UNIQUE", "LAST USE", "BUNDLES", "LEASES",
                   "IMAGE"],
                  ([row.digest.removeprefix("sha256:")[:12], row.platform, format_size(row.size),
                    format_size(row.unique_size), _ago(row.last_used), str(len(row.bundles)),
                    _lease_text(row.leases), row.name + (" (incomplete)" if row.missing else "")]
                   for row in self.images),
                  title="images", right=("SIZE", "UNIQUE"))
        if self.bundles:
            out.table(["BUNDLE", "SIZE", "UNIQUE", "LAST USE", "LEASES", "IMAGE"],
                      ([bundle.key[:12], format_size(bundle.disk), format_size(bundle.unique),
                        _ago(bundle.last_used),
                        _lease_text(bundle.leases), _bundle_image(bundle)]
                       for bundle in self.bundles),
                      title="bundles", right=("SIZE", "UNIQUE"))
        if self.squashfs:
            out.table(["SQUASHFS", "SIZE", "LAST USE", "LEASES", "IMAGE"],
                      ([image.key[:12], format_size(image.disk), _ago(image.last_used),
                        _lease_text(image.leases), image.source or "-"]
                       for image in self.squashfs),
                      title="squashfs images (ocistage-pyxis-importer)", right=("SIZE",))
        staged = [lease for lease in self.leases if lease.target.startswith("staged:")]
        if staged:
            out.table(["HOLDER", "SINCE", "LIVE", "PATH"],
                      ([lease.holder, _ago(lease.created), "yes" if lease.live else "no",
                        lease.target.removeprefix("staged:")
                        + (f" (on node {lease.node})" if lease.node else "")]
                       for lease in staged),
                      title="staged bundles")


def _bundle_image(bundle: BundleRow) -> str:
    """The image a bundle is of: the name it was made for while cached under it, else a name
    its image is cached under now (``cache rm`` of one of two names of an image), else
    ``(gone)``."""
    if bundle.image in bundle.names or (bundle.names and bundle.image is None):
        return bundle.image or bundle.names[0]
    if bundle.names:
        return f"{bundle.names[0]} (made for {bundle.image})"
    return (bundle.image or "-") + " (gone)"


def _ago(when: float) -> str:
    return f"{format_age(time.time() - when)} ago" if when > 0 else "-"


def _lease_text(leases: tuple[LeaseRow, ...]) -> str:
    return ", ".join(lease.holder + ("" if lease.live else " (dead)") for lease in leases) or "-"


def lease_rows(leases: Iterable[Lease], states: dict[str, str] | None) -> list[LeaseRow]:
    return [LeaseRow(lease.id, ", ".join(lease.targets), lease.holder.describe(),
                     lease.created, is_live(lease, states), lease.node) for lease in leases]


def _bundle_rows(bundles: list[Bundle], refs: list[Ref], uses: dict[tuple[str, str], float],
                 leases_for: Callable[[str], tuple[LeaseRow, ...]]) -> tuple[BundleRow, ...]:
    """``cache ls``'s cached bundles: each with its own sizes and the names of its image."""
    names: dict[Digest, list[str]] = {}
    for ref in sorted(refs, key=lambda r: r.name):
        names.setdefault(ref.digest, []).append(ref.name)
    return tuple(
        BundleRow(key=b.key, image=b.image, manifest=str(b.manifest) if b.manifest else None,
                  last_used=bundle_last_used(b, uses), disk=disk, unique=unique,
                  orphan=b.manifest not in names, leases=leases_for(b.target),
                  names=tuple(dict.fromkeys(names.get(b.manifest, ()) if b.manifest else ())))
        for b in bundles for disk, unique in [tree_shares(b.path)])


def listing(store: Store, job_states: JobStates = squeue_states) -> Listing:
    """What ``cache ls`` shows: images, cached bundles and leases."""
    refs = read_refs(store)
    blobs = list_blobs(store)
    bundles = list_bundles(store)
    leases = all_leases(store.root)
    states = job_states_of(leases, job_states)
    uses = usage.all_usage(store.root)
    reached_by: dict[Digest, int] = {}
    for ref in refs:
        for digest in set(ref.blobs):
            reached_by[digest] = reached_by.get(digest, 0) + 1

    def leases_for(target: str) -> tuple[LeaseRow, ...]:
        return tuple(lease_rows([x for x in leases if target in x.targets], states))

    images = []
    for ref in refs:
        reached = set(ref.blobs)
        images.append(ImageRow(
            name=ref.name, platform=ref.platform, digest=str(ref.digest),
            resolved=ref.resolved, last_used=ref_last_used(ref, uses),
            size=sum(blobs[d].size for d in reached if d in blobs),
            unique_size=sum(blobs[d].size for d in reached
                            if d in blobs and reached_by.get(d) == 1),
            missing=tuple(str(d) for d in ref.missing),
            bundles=tuple(b.key for b in bundles if b.manifest == ref.digest),
            leases=leases_for(ref.target)))
    bundle_rows = _bundle_rows(bundles, refs, uses, leases_for)
    return Listing(tuple(sorted(images, key=lambda i: (i.name, i.platform))), bundle_rows,
                   tuple(lease_rows(leases, states)), _squashfs_rows(store, leases_for))


def _squashfs_rows(store: Store, leases_for: Callable[[str], tuple[LeaseRow, ...]]
                   ) -> tuple[SquashfsRow, ...]:
    return tuple(SquashfsRow(image.key, image.source, image.last_used, image.size,
                             leases_for(image.target))
                 for image in list_images(store.root))

