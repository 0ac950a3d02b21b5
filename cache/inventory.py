"""What the cache holds: refs and the blobs they reach, blobs, bundles, and their last use.

Read by ``cache ls``/``du``, gc and verify; the tables are :mod:`ocistage.cache.listing` and
:mod:`ocistage.cache.diskusage`, the sizes of a tree :mod:`ocistage.cache.treesize`.

Everything here reads; nothing changes the cache except :func:`write_bundle_info`, which
``ocistage.bundler.flows.bundle`` calls on a bundle's scratch directory before publishing it.

A ref (one ``index.json`` entry) reaches its manifest, the manifest's config and layers (and
the children of an index, if a ref names one), plus the index it was chosen from when the pull
recorded one (annotation ``io.ocistage.index-digest``). A cached bundle records the manifest it
was made from in ``CACHE/bundles/<key>/.ocistage-bundle.json``; it belongs to every ref naming
that manifest. A layer snapshot (``ocistage.cache.snapshots``) belongs to every ref whose layers
start with the snapshot's layers (its ChainID is one of the ref's ChainIDs).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ocistage.cache.builddirs import scratch_target
from ocistage.cache.bundleinfo import read_bundle_info
from ocistage.cache.digest import Digest
from ocistage.cache.refnames import INDEX_MEDIA_TYPE, REF_NAME, is_alias, platform_path, record_name
from ocistage.cache.snapshots import chain_ids
from ocistage.cache.store import BUNDLES, Store
from ocistage.errors import OcistageError

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
        reach = _reach(store, entry, aliases.get(name))
        if reach is None:
            continue
        digest, present, missing = reach
        refs.append(Ref(name=name,
                        platform=platform_text(entry), digest=digest,
                        media_type=str(entry.get("mediaType", "")),
                        resolved=(entry.get("annotations") or {}).get(ANNOTATION_RESOLVED),
                        blobs=tuple(present), missing=tuple(missing), entry=entry,
                        chain_ids=_chain_ids(store, digest)))
    return refs


def reached_only_by(store: Store, entries: list[dict[str, Any]], name: str) -> set[Digest]:
    """The blobs present that the records of ref ``name`` among ``entries`` (index.json's)
    reach and no other record does, counted as :func:`read_refs` counts them: with the
    indexes they were chosen from and those their aliases name."""
    aliases = _alias_indexes(entries)
    mine: set[Digest] = set()
    others: set[Digest] = set()
    for entry in entries:
        ref = record_name(entry)
        reach = _reach(store, entry, aliases.get(ref)) if ref is not None else None
        if reach is not None:
            (mine if ref == name else others).update(reach[1])
    return mine - others


def _reach(store: Store, entry: dict[str, Any], alias_index: str | None
           ) -> tuple[Digest, list[Digest], list[Digest]] | None:
    """A record's digest and the blobs it reaches (present, missing), the index it was chosen
    from and ``alias_index`` (the index its alias names) included; None for a bad digest."""
    try:
        digest = Digest.parse(str(entry.get("digest", "")))
    except OcistageError:
        return None
    annotations = entry.get("annotations") or {}
    indexes = []
    for index_text in (annotations.get(ANNOTATION_INDEX), alias_index):
        if index_text:
            with contextlib.suppress(OcistageError):
                indexes.append(Digest.parse(str(index_text)))
    present, missing = reachable(store, digest)
    for index in indexes:
        (present if store.has_blob(index) else missing).append(index)
    return digest, present, missing


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
