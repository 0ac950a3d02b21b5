"""``stage_directory``: put a bundle (or any tree) at ``TO/NAME``, incrementally and atomically.

The target's layout is :mod:`ocistage.cache.targetlayout`'s; the sequence around a staging is
:class:`ocistage.stagers.transaction.Staging`'s. This module is the directory strategy.

How files get there (``method``, :class:`~ocistage.stagers.target.Method`; each has its placer in
:mod:`ocistage.stagers.placers`):

- ``hardlink``: the source is *sealed* (a bundle in the cache, see below) and on TO's
  filesystem: every file is a hardlink of the source file, no byte is copied; any other source
  can be written (a ``bundle REF DEST``), and a write there would change the staged copy;
- ``pool``: another filesystem, or a source that is not sealed: each distinct (content, mode)
  is copied once into the pool (our own read-only copies) and hardlinked into the bundle (a
  new image version or a second image copies only what differs);
- ``copy`` (``link=False``): independent files (reflink, ``copy_file_range``, ``sendfile``);
  unchanged files of the previous version of the same name are carried over by hardlink.

When the staged files share inodes with the cache or other bundles (``hardlink``, ``pool``), a
top-level ``config.json`` is rewritten (as a private file) with ``root.readonly = true``, so a
container cannot write through into shared files.

Every run takes a lock per name (so eight processes staging the same bundle make one copy),
compares the source with the previous manifest by stat (unchanged: nothing is written), hashes
only changed files, builds the new version in ``TO/.ocistage-tmp[-<uid>]/`` and publishes it
with one ``rename()`` — or an atomic ``RENAME_EXCHANGE`` with the previous version, which is
then removed. A killed stager leaves only a scratch dir and a lock owned by a dead process; the
next run removes both. A source that is a bundle in the cache (``CACHE/bundles/<key>``,
published once and never written again) is *sealed*: when its identity (path, inode, mtime)
matches the manifest, re-staging does not even walk it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache.cpus import usable_cpus
from ocistage.cache.leases import Holder
from ocistage.stagers.builder import FORK_MIN_FILES, Builder
from ocistage.stagers.collectorpause import cyclic_gc_paused
from ocistage.stagers.errors import StageError, StageUsageError
from ocistage.stagers.filemanifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    Entry,
    Manifest,
    Record,
    entries_of,
    fill_missing_hashes,
    fill_xattrs,
)
from ocistage.stagers.fresh import build_first
from ocistage.stagers.markers import default_holder, record_bundle_use
from ocistage.stagers.mksquashfs import ImageProgress
from ocistage.stagers.pool import Pool
from ocistage.stagers.released import released_keys
from ocistage.stagers.restage import restage_through_pool
from ocistage.stagers.statwalk import parallel_walk_digest
from ocistage.stagers.target import (
    Format,
    Method,
    StageResult,
    choose_method,
    source_identity,
    write_private,
)
from ocistage.stagers.transaction import Staging

__all__ = ["StageResult", "stage_directory", "stage_tree"]

log = logging.getLogger(__name__)

# -- staging a tree (the library call of runtimes, bench and ocistage.bundler.flows.stage)
# ----------------

def stage_directory(source: Path, to: Path, *, cache_root: Path, name: str | None = None,
                    holder: Holder | None = None, link: bool | None = None, jobs: int = 8,
                    format: Format = "dir", source_label: str | None = None,
                    squashfs_mount: bool | None = None,
                    image_progress: ImageProgress | None = None,
                    local: bool = False) -> StageResult:
    """Stage the tree ``source`` at ``to/name`` (see the module docstring); print nothing.

    ``link``: None shares inodes where possible (hardlink or pool), False makes independent
    copies, True insists on hardlinks from the source. ``source_label`` is what the marker
    records as the source (default: the source path). ``squashfs_mount``: None mounts the
    image where FUSE works and unpacks it elsewhere, True insists on mounting, False unpacks.
    ``image_progress``: told (files done, files) while a squashfs image is built.
    ``local``: ``to`` is this node's own (``stage --all-nodes``): the lease records the node.
    """
    if format != "squashfs":
        return stage_tree(source, to, cache_root=cache_root, name=name, holder=holder,
                          link=link, jobs=jobs, source_label=source_label, local=local)
    from ocistage.stagers.squashfs import stage_squashfs  # not needed by the directory format

    with _staging(source, to, cache_root, name, holder, local) as (staging, source, _identity):
        return stage_squashfs(staging, source, source_label or os.fspath(source),
                              mount_image=squashfs_mount, jobs=jobs, progress=image_progress)


def stage_tree(source: Path, to: Path, *, cache_root: Path, name: str | None = None,
               holder: Holder | None = None, link: bool | None = None, jobs: int = 8,
               source_label: str | None = None, local: bool = False) -> StageResult:
    """:func:`stage_directory` in the directory format alone, without the squashfs strategy
    (what scrun's stage-in calls for an engine's rootfs)."""
    with _staging(source, to, cache_root, name, holder, local) as (staging, source, identity):
        return _stage_tree(staging, source, source_label or os.fspath(source), identity, link,
                           jobs)


@contextmanager
def _staging(source: Path, to: Path, cache_root: Path, name: str | None,
             holder: Holder | None, local: bool = False,
             ) -> Iterator[tuple[Staging, Path, str]]:
    """The staging of ``source`` (made absolute, a directory outside ``to``) at ``to/name``,
    and the source's sealed identity (:func:`source_identity`, "" if it is not sealed)."""
    source = Path(os.path.abspath(source))
    if not source.is_dir():
        raise StageError(f"{source} is not a directory", "stage a bundle directory or a REF")
    to = Path(os.path.abspath(to))
    real_source, real_to = os.path.realpath(source), os.path.realpath(to)
    if os.path.commonpath([real_source, real_to]) == real_source:
        raise StageUsageError(f"the target {to} is inside the source {source}",
                              "stage to a directory outside the tree being staged")
    record_bundle_use(source, cache_root)
    identity = source_identity(source, cache_root)  # "": not sealed
    with cyclic_gc_paused(), Staging(to, name or source.name, cache_root=cache_root,
                                     holder=holder or default_holder(),
                                     what=os.fspath(source), local=local) as staging:
        yield staging, source, identity


# -- the directory strategy: fill a scratch tree by hardlink, pool or copy ---------------------

@dataclass
class _Compared:
    """What the walk of a re-stage found: the previous version and the source's entries."""

    previous: Manifest | None
    before: dict[str, Entry]     # previous.by_path()
    entries: list[Entry]         # unchanged files keep their previous hashes
    tree: str                    # stat digest of the source


def _stage_tree(staging: Staging, source: Path, label: str, identity: str,
                link: bool | None, jobs: int) -> StageResult:
    """Stage the tree ``source`` (``identity``: :func:`source_identity`, "" if it is not
    sealed) unless it is unchanged."""
    staging.refuse_foreign("dir")
    method = choose_method(source, staging.to, staging.tmp, link, sealed=bool(identity))
    marker = staging.marker
    same = marker if marker is not None and marker.method == method else None
    # unchanged? a sealed source by its identity, anything else by one stat walk — whose
    # records are kept, so a changed tree is not walked a second time for its entries
    if same is not None and identity and same.sealed == identity:
        return staging.unchanged(same.files, method.value)
    compared: _Compared | None = None
    if marker is not None or method == Method.COPY:
        # hardlink staging: no ctimes (its own links move them; the inode carries its xattrs)
        with parallel_walk_digest(source, min(jobs, usable_cpus()),
                                  ctime=method != Method.HARDLINK) as walked:
            # the previous manifest (and the walk's records) are read only when the tree
            # changed (on an unchanged tree of 100k files, reading and indexing it cost more
            # than the walk)
            if same is not None and not identity and same.tree == walked.digest:
                return staging.unchanged(same.files, method.value)
            if same is not None and method == Method.POOL:  # the walk's workers place it
                done = restage_through_pool(staging, source, label, identity, walked, jobs)
                if done is not None:
                    _warn_refused_xattrs(done[1], staging)
                    return done[0]
            compared = _compare(staging, source, walked.records(), walked.digest, method)
    return _build(staging, source, label, method, identity, compared, jobs)


def _compare(staging: Staging, source: Path, records: list[Record], tree: str,
             method: Method) -> _Compared:
    """The entries of a walk's ``records`` (stat digest ``tree``) of ``source`` beside the
    previous manifest."""
    previous = staging.previous()
    before = previous.by_path() if previous is not None else {}
    # unchanged files keep their hashes and xattr digests from the previous manifest (never
    # read again); hardlink staging needs neither (the staged file is the source's inode)
    entries = entries_of(records, before if method != Method.HARDLINK else None)
    if method != Method.HARDLINK:
        entries = fill_xattrs(source, entries)
    return _Compared(previous, before, entries, tree)


def _build(staging: Staging, source: Path, label: str, method: Method, identity: str,
           compared: _Compared | None, jobs: int) -> StageResult:
    """Build the new version in a scratch dir and publish it. ``compared`` None: a first
    stage, which walks and places at once (ocistage.stagers.fresh)."""
    pool = Pool.of_target(staging.to)
    previous = compared.previous if compared is not None else None
    before = compared.before if compared is not None else {}
    # pool: each file is hashed while it is copied into an empty pool (one pass);
    # hardlink: the staged file is the source's inode, no hash is needed to stage it
    one_pass = method == Method.POOL and previous is None and pool.is_empty()
    builder = _builder(staging, source, method, previous, before, pool, jobs)
    try:
        if compared is None:  # the entries come with the hashes computed on the way
            hash_first = method == Method.POOL and not one_pass
            entries, tree = build_first(builder, min(jobs, usable_cpus()), hash_first)
        else:
            hashed = method == Method.HARDLINK or one_pass  # else: hashed before placing
            entries = _build_compared(builder, source, compared.entries, hashed, jobs)
            tree = compared.tree
    finally:
        builder.close()
    _warn_refused_xattrs(builder.placer.copier.xattrs_refused.value, staging)
    manifest, files = _write_version(staging, builder.scratch, label, method, identity,
                                     entries, tree)
    processes = min(jobs, usable_cpus()) if files >= FORK_MIN_FILES else 1
    released = (released_keys(previous, manifest, before, builder.replaced,
                               builder.counts.unchanged)
                if previous is not None and previous.method == Method.POOL else None)
    staging.publish(builder.scratch, processes, released)
    counts = builder.counts
    return StageResult(staging.final, files, counts.copied, counts.linked, counts.unchanged,
                       counts.bytes_copied, staging.lease.id, method.value)


def _warn_refused_xattrs(refused: int, staging: Staging) -> None:
    """One warning for the ``refused`` extended attributes, if any, with their count."""
    if refused:
        log.warning("%s: %d extended attribute(s) of the source could not be set on the "
                    "staged copies (not supported by the target, or not permitted: "
                    "security.capability needs root); staged without them",
                    staging.final, refused)


def _builder(staging: Staging, source: Path, method: Method, previous: Manifest | None,
             before: dict[str, Entry], pool: Pool, jobs: int) -> Builder:
    """The builder of the new version, in a new scratch dir."""
    if method == Method.POOL:
        staging.use_pool()
    scratch = staging.scratch()
    # a copy's unchanged files are carried over as hardlinks of the previous version's:
    # not while a job still running on that version (it will be retired) may write to them
    carry_over = not (method == Method.COPY and previous is not None and staging.users())
    return Builder(source, scratch, staging.final, method, previous, pool, jobs, before,
                   carry_over=carry_over)


def _write_version(staging: Staging, scratch: Path, label: str, method: Method,
                   identity: str, entries: list[Entry], tree: str) -> tuple[Manifest, int]:
    """Write the manifest and the marker of the version built in ``scratch``; returns the
    manifest and how many files it has."""
    files = sum(1 for e in entries if e.type == "file")
    manifest = Manifest(tuple(entries), source=identity, method=method.value,
                        readonly_root=method != Method.COPY)
    write_private(scratch / MANIFEST_NAME, manifest.chunks())
    write_private(scratch / MARKER_NAME, staging.new_marker(
        label, method.value, tree=tree, sealed=identity, files=files).to_json())
    return manifest, files


def _build_compared(builder: Builder, source: Path, entries: list[Entry], hashed: bool,
                    jobs: int) -> list[Entry]:
    """Build the ``entries`` of a walk (``hashed``: as they are, else with the hashes of the
    new or changed files filled in first); returns them with their hashes."""
    if not hashed:
        entries, _hashed = fill_missing_hashes(source, entries, jobs)
    builder.build(entries)
    return _hardlink_group_hashes(builder.with_hashes(entries))


def _hardlink_group_hashes(entries: list[Entry]) -> list[Entry]:
    """Give members of a source hardlink group that were not hashed their group's hash."""
    if all(e.hash for e in entries if e.type == "file"):
        return entries
    by_inode = {(e.dev, e.ino): e.hash for e in entries if e.type == "file" and e.hash}
    return [e.with_hash(by_inode.get((e.dev, e.ino))) if e.type == "file" and not e.hash
            else e for e in entries]
