"""What the cache holds: refs and the blobs they reach, bundles, sizes (``cache ls`` / ``du``).

Everything here reads; nothing changes the cache except :func:`write_bundle_info`, which
``ocistage.bundler.flows.bundle`` calls on a bundle's scratch directory before publishing it.

A ref (one ``index.json`` entry) reaches its manifest, the manifest's config and layers (and
the children of an index, if a ref names one), plus the index it was chosen from when the pull
recorded one (annotation ``io.ocistage.index-digest``). A cached bundle records the manifest it
was made from in ``CACHE/bundles/<key>/.ocistage-bundle.json``; it belongs to every ref naming
that manifest. A layer snapshot (``ocistage.cache.snapshots``) belongs to every ref whose layers
start with the snapshot's layers (its ChainID is one of the ref's ChainIDs).

Sizes: *logical* bytes are file sizes as if nothing were shared (every ref counting its own
layers, every hardlink counting again); *disk* bytes are allocated blocks (``st_blocks``), each
inode counted once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.cache import reserve, usage
from ocistage.cache.builddirs import scratch_target
from ocistage.cache.bundleinfo import read_bundle_info
from ocistage.cache.digest import Digest
from ocistage.cache.evict import evicted_in
from ocistage.cache.leases import (
    JobStates,
    Lease,
    all_leases,
    is_live,
    job_states_of,
    squeue_states,
)
from ocistage.cache.pyxisimages import images_dir, list_images
from ocistage.cache.refnames import INDEX_MEDIA_TYPE, REF_NAME, is_alias, platform_path, record_name
from ocistage.cache.sizes import format_age, format_size
from ocistage.cache.snapshots import SnapshotInfo, chain_ids, list_snapshots
from ocistage.cache.store import BUNDLES, QUARANTINE, SNAPSHOTS, Store
from ocistage.cache.treewalk import path_stats
from ocistage.errors import OcistageError

if TYPE_CHECKING:
    from ocistage.results import Renderer

ANNOTATION_RESOLVED = "io.ocistage.resolved"
ANNOTATION_INDEX = "io.ocistage.index-digest"
_MAX_DOCUMENT = 4 << 20


# -- refs and the blobs they reach ---------------------------------------------------------------

@dataclass(frozen=True)
class Ref:
    """One ``index.json`` entry and the blobs it reaches."""

    name: str
    platform: str
    digest: Digest                  # the manifest (or index) it points at
    media_type: str
    resolved: str | None            # when the pull resolved it (ISO 8601, UTC)
    blobs: tuple[Digest, ...]       # reachable blobs present in the store
    missing: tuple[Digest, ...]     # reachable blobs the store lacks (a broken ref)
    entry: dict[str, Any] = field(repr=False, compare=False)
    chain_ids: tuple[Digest, ...] = ()  # ChainIDs of its layer prefixes (snapshots it uses)

    @property
    def target(self) -> str:
        return f"image:{self.name}"

    def same_entry(self, other: dict[str, Any]) -> bool:
        """Whether index.json entry ``other`` is still this ref (same name, platform, digest)."""
        return (record_name(other) == self.name
                and other.get("platform") == self.entry.get("platform")
                and other.get("digest") == str(self.digest))


def platform_text(entry: dict[str, Any]) -> str:
    return platform_path(entry.get("platform"))


def _children(document: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(blob digests, child manifest digests) named by a manifest or index document."""
    blobs: list[str] = []
    manifests: list[str] = []
    config = document.get("config")
    if isinstance(config, dict) and isinstance(config.get("digest"), str):
        blobs.append(config["digest"])
    for layer in document.get("layers") or ():
        if isinstance(layer, dict) and isinstance(layer.get("digest"), str):
            blobs.append(layer["digest"])
    for child in document.get("manifests") or ():
        if isinstance(child, dict) and isinstance(child.get("digest"), str):
            manifests.append(child["digest"])
    return blobs, manifests


def reachable(store: Store, top: Digest) -> tuple[list[Digest], list[Digest]]:
    """Blobs reachable from manifest/index ``top``: (present, missing), ``top`` included."""
    present: list[Digest] = []
    missing: list[Digest] = []
    seen: set[Digest] = set()
    pending: list[tuple[Digest, bool]] = [(top, True)]
    while pending:
        digest, is_document = pending.pop()
        if digest in seen:
            continue
        seen.add(digest)
        if not store.has_blob(digest):
            missing.append(digest)
            continue
        present.append(digest)
        if not is_document:
            continue
        try:
            document = json.loads(store.read_blob(digest, _MAX_DOCUMENT))
        except (OcistageError, ValueError):
            continue  # not JSON: reaches nothing more (verify reports a corrupt blob)
        if not isinstance(document, dict):
            continue
        blobs, manifests = _children(document)
        for text, child_is_document in [(b, False) for b in blobs] + [(m, True)
                                                                     for m in manifests]:
            with contextlib.suppress(OcistageError):
                pending.append((Digest.parse(text), child_is_document))
    return present, missing


def _chain_ids(store: Store, manifest: Digest) -> tuple[Digest, ...]:
    """ChainIDs of an image manifest's layer prefixes, from its config's diff_ids."""
    try:
        document = json.loads(store.read_blob(manifest, _MAX_DOCUMENT))
        config = json.loads(store.read_blob(Digest.parse(str(document["config"]["digest"])),
                                            _MAX_DOCUMENT))
        diff_ids = [Digest.parse(str(d)) for d in config["rootfs"]["diff_ids"]]
    except (OcistageError, ValueError, KeyError, TypeError):
        return ()
    return tuple(chain_ids(diff_ids))


def _alias_indexes(entries: list[dict[str, Any]]) -> dict[str, str]:
    """ref name -> the digest of the index its alias names (ocistage.cache.refnames)."""
    return {str(entry["annotations"].get(REF_NAME)): str(entry.get("digest"))
            for entry in entries if is_alias(entry) and entry.get("mediaType") == INDEX_MEDIA_TYPE}


def read_refs(store: Store) -> list[Ref]:
    """Every ref in index.json, one per platform (its record; see ocistage.cache.refnames), with the
    blobs it reaches, the index its alias names included (entries with a bad digest skipped)."""
    refs: list[Ref] = []
    entries = store.read_index()
    aliases = _alias_indexes(entries)
    for entry in entries:
        name = record_name(entry)
        if name is None:
            continue
        annotations = entry.get("annotations") or {}
        try:
            digest = Digest.parse(str(entry.get("digest", "")))
        except OcistageError:
            continue
        present, missing = reachable(store, digest)
        for index_text in (annotations.get(ANNOTATION_INDEX), aliases.get(name)):
            if index_text:
                with contextlib.suppress(OcistageError):
                    index = Digest.parse(str(index_text))
                    (present if store.has_blob(index) else missing).append(index)
        refs.append(Ref(name=name,
                        platform=platform_text(entry), digest=digest,
                        media_type=str(entry.get("mediaType", "")),
                        resolved=annotations.get(ANNOTATION_RESOLVED),
                        blobs=tuple(present), missing=tuple(missing), entry=entry,
                        chain_ids=_chain_ids(store, digest)))
    return refs


# -- blobs ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Blob:
    digest: Digest
    path: Path
    size: int      # st_size
    disk: int      # allocated bytes
    mtime: float


def list_blobs(store: Store) -> dict[Digest, Blob]:
    """Every published blob (temp files of writers and foreign names are not blobs)."""
    result: dict[Digest, Blob] = {}
    with contextlib.suppress(FileNotFoundError), os.scandir(store.blobs) as algorithms:
        directories = [Path(a.path) for a in algorithms if a.is_dir(follow_symlinks=False)]
    for directory in directories:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                try:
                    digest = Digest.parse(f"{directory.name}:{entry.name}")
                    st = entry.stat(follow_symlinks=False)
                except (OcistageError, FileNotFoundError):
                    continue
                if stat.S_ISREG(st.st_mode):
                    result[digest] = Blob(digest, Path(entry.path), st.st_size,
                                          st.st_blocks * 512, st.st_mtime)
    return result


# -- bundles -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bundle:
    key: str
    path: Path
    manifest: Digest | None   # None: made before bundles recorded their image, or unreadable
    image: str | None         # the ref name it was made for (informational)
    mtime: float

    @property
    def target(self) -> str:
        return f"bundle:{self.key}"


def bundles_dir(store: Store) -> Path:
    return store.root / BUNDLES


def list_bundles(store: Store) -> list[Bundle]:
    """Published bundles in ``CACHE/bundles`` (scratch dirs of builds in progress excluded)."""
    result: list[Bundle] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(bundles_dir(store)) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            path = Path(entry.path)
            manifest, image = read_bundle_info(path)
            with contextlib.suppress(FileNotFoundError):
                result.append(Bundle(entry.name, path, manifest, image,
                                     entry.stat(follow_symlinks=False).st_mtime))
    return sorted(result, key=lambda b: b.key)


def bundle_scratch_dirs(store: Store) -> list[Path]:
    with contextlib.suppress(FileNotFoundError), os.scandir(bundles_dir(store)) as entries:
        return [Path(e.path) for e in entries if scratch_target(Path(e.path)) is not None]
    return []


# -- sizes ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TreeSize:
    logical: int
    disk: int
    files: int


def tree_size(path: Path, seen: set[tuple[int, int]] | None = None,
              linked: dict[tuple[int, int], int] | None = None) -> TreeSize:
    """Sizes of everything under ``path`` (not following links); inodes in ``seen`` count once.

    Pass one ``seen`` set to several calls to count inodes shared between trees once overall.
    ``linked`` collects the bytes on disk of each inode counted here that has more than one
    link (what another tree may share). The walk goes through descriptors
    (:func:`ocistage.cache.treewalk.path_stats`): any depth, any path length.
    """
    seen = set() if seen is None else seen
    logical = disk = files = 0
    stats = path_stats(path)
    st = next(stats, None)
    if st is None:
        return TreeSize(0, 0, 0)
    if not stat.S_ISDIR(st.st_mode):
        seen.add((st.st_dev, st.st_ino))
        if linked is not None and st.st_nlink > 1:
            linked[(st.st_dev, st.st_ino)] = st.st_blocks * 512
        return TreeSize(st.st_size, st.st_blocks * 512, 1)
    disk += st.st_blocks * 512
    for est in stats:
        files += 1
        if stat.S_ISDIR(est.st_mode):
            disk += est.st_blocks * 512
            continue
        logical += est.st_size
        inode = (est.st_dev, est.st_ino)
        if inode not in seen:
            seen.add(inode)
            disk += est.st_blocks * 512
            if linked is not None and est.st_nlink > 1:
                linked[inode] = est.st_blocks * 512
    return TreeSize(logical, disk, files)


def tree_shares(path: Path) -> tuple[int, int]:
    """``path``'s bytes on disk (each inode once) and those only it holds: its directories and
    the files whose every link is inside it (none in a snapshot, another bundle or a staged
    copy). Both are the tree's own, whatever else is measured before or after it."""
    disk = unique = 0
    shared: dict[tuple[int, int], list[int]] = {}  # inode -> [links seen here, st_nlink, bytes]
    for st in path_stats(path):
        size = st.st_blocks * 512
        if stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1:
            disk += size
            unique += size
            continue
        found = shared.get((st.st_dev, st.st_ino))
        if found is None:
            shared[(st.st_dev, st.st_ino)] = [1, st.st_nlink, size]
        else:
            found[0] += 1
    for links, nlink, size in shared.values():
        disk += size
        unique += size if links >= nlink else 0
    return disk, unique


# -- last use --------------------------------------------------------------------------------------

def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def ref_last_used(ref: Ref, uses: dict[tuple[str, str], float]) -> float:
    """Recorded last use of the ref's manifest, else its resolution time, else 0."""
    recorded = uses.get(("image", ref.digest.hex))
    if recorded is not None:
        return recorded
    return _parse_time(ref.resolved) or 0.0


def bundle_last_used(bundle: Bundle, uses: dict[tuple[str, str], float]) -> float:
    return uses.get(("bundle", bundle.key), bundle.mtime)


def snapshot_target(snapshot: SnapshotInfo) -> str:
    return f"snapshot:{snapshot.chain_id}"


# -- cache ls ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LeaseRow:
    id: str
    target: str
    holder: str
    created: float
    live: bool


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
                        lease.target.removeprefix("staged:")] for lease in staged),
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
                     lease.created, is_live(lease, states)) for lease in leases]


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


# -- cache du ------------------------------------------------------------------------------------

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
