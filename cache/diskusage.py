"""What ``cache du`` shows: each part of the cache (blobs, snapshots, bundles, importer images,
scratch, quarantine, the rest) in logical bytes and on disk (:func:`disk_usage`).

*Logical* bytes are file sizes as if nothing were shared (every ref counting its own layers,
every hardlink counting again); *disk* bytes are allocated blocks (``st_blocks``), each inode
counted once, also across parts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.cache import reserve, usage
from ocistage.cache.evict import evicted_in
from ocistage.cache.inventory import bundle_scratch_dirs, list_blobs, list_bundles, read_refs
from ocistage.cache.pyxisimages import images_dir, list_images
from ocistage.cache.sizes import format_size
from ocistage.cache.snapshots import list_snapshots
from ocistage.cache.store import BUNDLES, QUARANTINE, SNAPSHOTS, Store
from ocistage.cache.treesize import TreeSize, tree_size

if TYPE_CHECKING:
    from ocistage.results import Renderer


@dataclass(frozen=True)
class Usage:
    """One part of the cache: how much it would take without dedup, and what it takes."""

    logical: int
    disk: int
    count: int


@dataclass(frozen=True)
class DiskUsage:
    images: Usage         # logical: every ref counting every blob it reaches
    blobs: Usage          # unique blobs as stored
    snapshots: Usage      # unpacked layer trees (ocistage.cache.snapshots)
    bundles: Usage        # files hard-linked to snapshots or each other count once on disk
    squashfs: Usage       # images of ocistage-pyxis-importer, with their records (count: images)
    scratch: Usage        # partial downloads, temp dirs, bundles being built
    quarantine: Usage
    other: Usage          # leases, last-use records, index.json, locks

    @property
    def total_disk(self) -> int:
        return (self.blobs.disk + self.snapshots.disk + self.bundles.disk + self.squashfs.disk
                + self.scratch.disk + self.quarantine.disk + self.other.disk)

    @property
    def total_logical(self) -> int:
        return (self.images.logical + self.snapshots.logical + self.bundles.logical
                + self.squashfs.logical + self.scratch.logical + self.quarantine.logical
                + self.other.logical)

    def to_json(self) -> dict[str, Any]:
        """What ``cache du --json`` prints: every part, and the totals."""
        return {**dataclasses.asdict(self), "total": {"logical": self.total_logical,
                                                      "disk": self.total_disk}}

    def render(self, out: Renderer) -> None:
        parts = (("blobs", self.blobs), ("snapshots", self.snapshots),
                 ("bundles", self.bundles), ("squashfs", self.squashfs),
                 ("scratch", self.scratch),
                 ("quarantine", self.quarantine), ("other", self.other))
        out.table(["PART", "COUNT", "LOGICAL", "ON DISK"],
                  [["images (blobs per image)", str(self.images.count),
                    format_size(self.images.logical), ""],
                   *([name, str(part.count), format_size(part.logical), format_size(part.disk)]
                     for name, part in parts),
                   ["total", "", format_size(self.total_logical), format_size(self.total_disk)]],
                  right=("COUNT", "LOGICAL", "ON DISK"), names_last=False)


def _sum(sizes: Iterable[TreeSize]) -> Usage:
    items = list(sizes)
    return Usage(sum(s.logical for s in items), sum(s.disk for s in items), len(items))


def disk_usage(store: Store) -> DiskUsage:
    """What ``cache du`` shows (see the module docstring for logical vs disk)."""
    refs = read_refs(store)
    blobs = list_blobs(store)
    images_logical = sum(blobs[d].size for ref in refs for d in set(ref.blobs) if d in blobs)
    blobs_disk = sum(b.disk for b in blobs.values())
    seen: set[tuple[int, int]] = set()  # a file linked from several parts counts once
    return DiskUsage(
        images=Usage(images_logical, blobs_disk, len(refs)),
        blobs=Usage(sum(b.size for b in blobs.values()), blobs_disk, len(blobs)),
        snapshots=_sum(tree_size(s.path, seen) for s in list_snapshots(store)),
        bundles=_sum(tree_size(b.path, seen) for b in list_bundles(store)),
        squashfs=_squashfs_usage(store, seen),
        scratch=_sum(tree_size(p, seen) for p in _scratch_paths(store)),
        quarantine=_sum(tree_size(p, seen) for p in _entries(store.root / QUARANTINE)),
        other=_sum(tree_size(p, seen) for p in _other_paths(store)),
    )


def _squashfs_usage(store: Store, seen: set[tuple[int, int]]) -> Usage:
    """The importer's images with their records, reference notes and build locks (the whole
    ``pyxis/`` directory); the count is that of the images."""
    total = _sum([tree_size(images_dir(store.root), seen)])
    return Usage(total.logical, total.disk, len(list_images(store.root)))


def _entries(directory: Path) -> list[Path]:
    """The entries of ``directory`` (none if it is absent)."""
    with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
        return [Path(e.path) for e in entries]
    return []


def _scratch_paths(store: Store) -> list[Path]:
    """Bundles being built, partial downloads and their locks, temp dirs, trees evicted beside
    bundles and snapshots (:mod:`ocistage.cache.evict`)."""
    return [*bundle_scratch_dirs(store), *_entries(store.ingest_dir), *_entries(store.tmp_dir),
            *evicted_in(store.root / BUNDLES), *evicted_in(store.root / SNAPSHOTS)]


def _other_paths(store: Store) -> list[Path]:
    """The layout's files, the space reserve, leases and last-use records."""
    return [store.root / "index.json", store.root / "oci-layout", store.root / reserve.NAME,
            *_entries(store.root / "leases"), *_entries(store.root / usage.USED_DIR)]

