"""``stage_directory``: put a bundle (or any tree) at ``TO/NAME``, incrementally and atomically.

Target layout (``TO`` is ``--to``)::

    TO/NAME/                      the staged tree + .ocistage-manifest.json + .ocistage-staged.json
    TO/NAME.sqfs                  the squashfs image of NAME (``--format squashfs`` only)
    TO/.ocistage-pool/<hh>/<key>  file contents shared by the bundles in TO (see stagers.pool)
    TO/.ocistage-tmp/             per-name lock files and scratch dirs of running stagers

How files get there (``method``):

- ``hardlink``: the source is on TO's filesystem: every file is a hardlink of the source file,
  no byte is copied;
- ``pool``: another filesystem: each distinct (content, mode) is copied once into the pool and
  hardlinked into the bundle (a new image version or a second image copies only what differs);
- ``copy`` (``link=False``): independent files (reflink, ``copy_file_range``, ``sendfile``);
  unchanged files of the previous version of the same name are carried over by hardlink.

When the staged files share inodes with the cache or other bundles (``hardlink``, ``pool``), a
top-level ``config.json`` is rewritten (as a private file) with ``root.readonly = true``, so a
container cannot write through into shared files.

Every run takes a lock per name (so eight processes staging the same bundle make one copy),
compares the source with the previous manifest by stat (unchanged: nothing is written), hashes
only changed files, builds the new version in ``TO/.ocistage-tmp/`` and publishes it with one
``rename()`` — or an atomic ``RENAME_EXCHANGE`` with the previous version, which is then removed.
A killed stager leaves only a scratch dir and a lock owned by a dead process; the next run
removes both. A source that is a bundle in the cache (``CACHE/bundles/<key>``, published once and
never written again) is *sealed*: when its identity (path, inode, mtime) matches the manifest,
re-staging does not even walk it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from cache.cpus import usable_cpus
from cache.fsops import release_owned_dir
from cache.leases import Holder, Lease
from cache.store import fsync_dir
from stagers.builder import FORK_MIN_FILES, Builder
from stagers.filemanifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    Entry,
    Manifest,
    Record,
    StageError,
    entries_of,
    fill_missing_hashes,
    load_manifest,
    walk_digest,
)
from stagers.fresh import build_first
from stagers.markers import (
    claim,
    default_holder,
    new_marker,
    read_marker,
    record_bundle_use,
    release_if_unused,
)
from stagers.pool import Pool, pool_key
from stagers.removal import remove_in_workers
from stagers.squashfs import stage_squashfs
from stagers.target import (
    LOCK_TIMEOUT,
    Format,
    StageResult,
    check_name,
    choose_method,
    clean_leftovers,
    drop_scratch,
    name_lock,
    new_scratch,
    publish,
    source_identity,
    write_private,
)

__all__ = ["StageResult", "stage_directory"]

# -- the entry point ------------------------------------------------------------------------

def stage_directory(source: Path, to: Path, *, cache_root: Path, name: str | None = None,
                    holder: Holder | None = None, link: bool | None = None, jobs: int = 8,
                    format: Format = "dir", source_label: str | None = None,
                    squashfs_mount: bool | None = None) -> StageResult:
    """Stage the tree ``source`` at ``to/name`` (see the module docstring); print nothing.

    ``link``: None shares inodes where possible (hardlink or pool), False makes independent
    copies, True insists on hardlinks from the source. ``source_label`` is what the marker
    records as the source (default: the source path). ``squashfs_mount``: None mounts the
    image where FUSE works and unpacks it elsewhere, True insists on mounting, False unpacks.
    """
    source = Path(os.path.abspath(source))
    if not source.is_dir():
        raise StageError(f"{source} is not a directory", "stage a bundle directory or a REF")
    name = check_name(name or source.name)
    to = Path(os.path.abspath(to))
    real_source, real_to = os.path.realpath(source), os.path.realpath(to)
    if os.path.commonpath([real_source, real_to]) == real_source:
        raise StageError(f"the target {to} is inside the source {source}",
                         "stage to a directory outside the tree being staged")
    try:
        to.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StageError(f"cannot create the target {to}: {exc.strerror}") from exc
    holder = holder or default_holder()
    label = source_label or os.fspath(source)
    record_bundle_use(source, cache_root)
    if format == "squashfs":
        return stage_squashfs(source, to, name, cache_root=cache_root, holder=holder,
                              label=label, mount_image=squashfs_mount, jobs=jobs)
    lock = name_lock(to, name)
    try:
        lock.acquire(timeout=LOCK_TIMEOUT)
        try:
            clean_leftovers(to, name)
            return _stage_locked(source, to, name, cache_root, holder, link, jobs, label)
        finally:
            lock.release()
    except OSError as exc:
        raise StageError(f"staging {source} to {to / name} failed: {exc.strerror} "
                         f"({exc.filename})") from exc


def _stage_locked(source: Path, to: Path, name: str, cache_root: Path, holder: Holder,
                  link: bool | None, jobs: int, label: str) -> StageResult:
    final = to / name
    lease, taken = claim(cache_root, final, holder)  # before looking at what is staged
    try:
        return _stage_claimed(source, to, name, cache_root, lease, link, jobs, label)
    except BaseException:
        release_if_unused(cache_root, final, lease, taken)
        raise


def _stage_claimed(source: Path, to: Path, name: str, cache_root: Path, lease: Lease,
                   link: bool | None, jobs: int, label: str) -> StageResult:
    final = to / name
    method = choose_method(source, to, link)
    marker = read_marker(final)
    if os.path.lexists(final) and marker is None:
        raise StageError(f"{final} exists and was not staged by ocistage",
                         "choose another --name or target, or remove it yourself")
    if marker is not None and marker.format != "dir":
        raise StageError(f"{final} holds a staged {marker.format} image, not a directory",
                         f"unstage it first (ocistage unstage {final}) or use --name")
    identity = source_identity(source, cache_root)
    # unchanged? a sealed source by its identity, anything else by one stat walk — whose
    # records are kept, so a changed tree is not walked a second time for its entries
    same_kind = marker is not None and marker.method == method and marker.format == "dir"
    if same_kind and identity and marker is not None and marker.sealed == identity:
        return StageResult(final, marker.files, 0, 0, marker.files, 0, lease.id, method)
    pool = Pool.of_target(to)
    # a first stage (nothing staged under this name) of a tree that is not copied walks
    # and places at once (stagers.fresh); otherwise the walk comes first, to compare
    first = marker is None and method != "copy"
    previous: Manifest | None = None
    before: dict[str, Entry] = {}
    entries: list[Entry] = []
    tree = ""
    if not first:
        records: list[Record] = []
        tree = walk_digest(source, records)
        if same_kind and not identity and marker is not None and marker.tree == tree:
            return StageResult(final, marker.files, 0, 0, marker.files, 0, lease.id, method)
        previous = load_manifest(final / MANIFEST_NAME) if marker is not None else None
        before = previous.by_path() if previous is not None else {}
        # unchanged files keep their hashes from the previous manifest (never read again)
        entries = entries_of(records, before if method != "hardlink" else None)
        del records
    # pool: each file is hashed while it is copied into an empty pool (one pass);
    # hardlink: the staged file is the source's inode, no hash is needed to stage it
    one_pass = method == "pool" and previous is None and pool.is_empty()
    hash_first = method == "pool" and not one_pass
    if not first and not one_pass and method != "hardlink":
        entries, _hashed = fill_missing_hashes(source, entries, jobs)
    if method == "pool":
        pool.prepare()
    scratch = new_scratch(to, name)
    try:
        builder = Builder(source, scratch, final, method, previous, pool, jobs, before)
        try:
            if first:  # the entries come with the hashes computed on the way
                entries, tree = build_first(builder, min(jobs, usable_cpus()), hash_first)
            else:
                builder.build(entries)
                entries = _hardlink_group_hashes(builder.with_hashes(entries))
        finally:
            builder.close()
        files = sum(1 for e in entries if e.type == "file")
        manifest = Manifest(tuple(entries), source=identity, method=method,
                            readonly_root=method != "copy")
        write_private(scratch / MANIFEST_NAME, manifest.to_json())
        write_private(scratch / MARKER_NAME, new_marker(
            lease, label, method, tree=tree, sealed=identity, files=files).to_json())
        os.chmod(scratch, 0o755)
        replaced = publish(scratch, final)
        fsync_dir(to)
    except BaseException:
        with contextlib.suppress(OSError):
            drop_scratch(scratch)
        raise
    if replaced is not None:
        processes = min(jobs, usable_cpus()) if files >= FORK_MIN_FILES else 1
        remove_in_workers(replaced, processes)
        if previous is not None and previous.method == "pool":
            pool.release(_released_keys(previous, manifest, before, builder.replaced,
                                         builder.counts.unchanged))
    release_owned_dir(scratch)
    counts = builder.counts
    return StageResult(final, files, counts.copied, counts.linked, counts.unchanged,
                       counts.bytes_copied, lease.id, method)


def _hardlink_group_hashes(entries: list[Entry]) -> list[Entry]:
    """Give members of a source hardlink group that were not hashed their group's hash."""
    if all(e.hash for e in entries if e.type == "file"):
        return entries
    by_inode = {(e.dev, e.ino): e.hash for e in entries if e.type == "file" and e.hash}
    return [e.with_hash(by_inode.get((e.dev, e.ino))) if e.type == "file" and not e.hash
            else e for e in entries]


def _released_keys(previous: Manifest, current: Manifest, before: dict[str, Entry],
                   replaced: list[Entry], unchanged: int) -> set[str]:
    """Pool keys the previous version used for a path that now has other content, or that is
    gone: the only entries the new version may have left unused. ``replaced``: the files of
    the new version not staged unchanged, ``unchanged``: how many were (both from
    :meth:`Builder.build`); ``before``: ``previous.by_path()``. :meth:`Pool.release` then
    removes those no bundle links to any more (a key still used elsewhere, e.g. by a moved
    file, has more links and stays). Costs a look at the replaced files only, unless some
    path of the previous version is gone."""
    keys = set()
    kept = 0  # replaced files whose path was a file before
    for entry in replaced:
        old = before.get(entry.path)
        if old is not None and old.type == "file":
            kept += 1
            if old.hash is not None and (old.hash, old.mode) != (entry.hash, entry.mode):
                keys.add(pool_key(old.hash, old.mode))
    if sum(1 for e in previous.entries if e.type == "file") != unchanged + kept:
        now = {e.path: (e.hash, e.mode) for e in current.entries if e.type == "file"}
        keys.update(pool_key(e.hash, e.mode) for e in previous.entries
                    if e.type == "file" and e.hash is not None
                    and now.get(e.path) != (e.hash, e.mode))
    return keys
