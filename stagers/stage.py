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
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cache.leases import Holder, Lease
from cache.store import fsync_dir
from stagers.copy import Copier
from stagers.filemanifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    Entry,
    Manifest,
    Record,
    StageError,
    entries_of,
    fill_missing_hashes,
    hash_file,
    load_manifest,
    walk_digest,
)
from stagers.markers import claim, default_holder, new_marker, record_bundle_use, release_if_unused
from stagers.parallel import map_batched, map_parts, usable_cpus
from stagers.pool import Pool, pool_key
from stagers.removal import remove_tree
from stagers.squashfs import stage_squashfs
from stagers.target import (
    LOCK_TIMEOUT,
    Format,
    Method,
    StageResult,
    check_name,
    choose_method,
    clean_leftovers,
    drop_scratch,
    name_lock,
    new_scratch,
    publish,
    read_existing_marker,
    readonly_config,
    source_identity,
    writable_config,
    write_private,
)

__all__ = ["StageResult", "stage_directory"]

_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: below this many files, forking workers costs more than it saves (threads are used)
FORK_MIN_FILES = 2000


@dataclass
class _Counts:
    copied: int = 0
    linked: int = 0
    unchanged: int = 0
    bytes_copied: int = 0


class _Builder:
    def __init__(self, source: Path, scratch: Path, final: Path, method: Method,
                 previous: Manifest | None, pool: Pool, jobs: int,
                 old: dict[str, Entry] | None = None) -> None:
        self.source = source
        self.scratch = scratch
        self._source_text = os.fspath(source)    # entry paths are appended per file
        self._scratch_text = os.fspath(scratch)
        self.final = final
        self.method = method
        if old is None:
            old = previous.by_path() if previous is not None else {}
        self.previous = old
        self.carry_over = previous is not None and previous.method == method
        self.pool = pool
        self.jobs = jobs
        self.counts = _Counts()
        self.copier = Copier()
        self.hashes: dict[str, str] = {}  # computed while copying (first stage into a pool)
        self.replaced: list[Entry] = []  # files not staged unchanged (new or changed)
        self._old_dirs: dict[str, int | None] = {}
        self._old_dirs_lock = threading.Lock()
        # descriptors that files are linked through (see _place_part); -1: not opened
        self._scratch_fd = os.open(scratch, _DIR_NOFOLLOW)
        self._source_fd = self._pool_fd = -1
        try:
            if method == "hardlink":
                self._source_fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            elif method == "pool":
                self._pool_fd = os.open(pool.root, _DIR_NOFOLLOW)
        except BaseException:
            os.close(self._scratch_fd)
            raise

    def close(self) -> None:
        for fd in self._old_dirs.values():
            if fd is not None:
                os.close(fd)
        self._old_dirs.clear()
        for fd in (self._scratch_fd, self._source_fd, self._pool_fd):
            if fd >= 0:
                os.close(fd)
        self._scratch_fd = self._source_fd = self._pool_fd = -1

    def _old_dir(self, rel_dir: str) -> int | None:
        """A descriptor of directory ``rel_dir`` of the previous version, reached without
        following any symlink (a container may have planted one in a writable copy)."""
        if rel_dir in self._old_dirs:  # a plain dict read: no lock needed once opened
            return self._old_dirs[rel_dir]
        with self._old_dirs_lock:
            return self._open_old_dir(rel_dir)

    def _open_old_dir(self, rel_dir: str) -> int | None:
        if rel_dir in self._old_dirs:
            return self._old_dirs[rel_dir]
        fd: int | None = None
        try:
            if not rel_dir:
                fd = os.open(self.final, _DIR_NOFOLLOW)
            else:
                parent_rel, _, name = rel_dir.rpartition("/")
                parent = self._open_old_dir(parent_rel)
                if parent is not None:
                    fd = os.open(name, _DIR_NOFOLLOW, dir_fd=parent)
        except OSError:
            fd = None
        self._old_dirs[rel_dir] = fd
        return fd

    def _carry_over(self, entry: Entry, dest: str) -> bool:
        """Hardlink the previous version's copy of ``entry`` at ``dest`` if it still is a
        plain file of the expected size and mode; False if not (then it is made anew)."""
        rel_dir, _, name = entry.path.rpartition("/")
        fd = self._old_dir(rel_dir)
        if fd is None:
            return False
        try:
            os.link(name, dest, src_dir_fd=fd, follow_symlinks=False)
        except OSError:
            return False
        st = os.lstat(dest)
        rewritten = entry.path == "config.json" and self.method != "copy"  # private copy
        if (not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != entry.mode
                or (st.st_size != entry.size and not rewritten)):
            os.unlink(dest)
            return False
        return True

    def build(self, entries: list[Entry]) -> None:
        scratch = os.fspath(self.scratch)
        files: list[Entry] = []
        timed: list[Entry] = []  # directories and symlinks: their mtimes are set last
        for entry in entries:
            if entry.type == "file":
                files.append(entry)
            elif entry.type == "dir":
                os.mkdir(f"{scratch}/{entry.path}", 0o700)
                timed.append(entry)
            elif entry.type == "symlink":
                assert entry.target is not None
                os.symlink(entry.target, f"{scratch}/{entry.path}")
                timed.append(entry)
            elif entry.type == "fifo":
                os.mkfifo(f"{scratch}/{entry.path}", entry.mode)
        groups: list[tuple[Entry, Entry]] = []
        singles: list[Entry] = files
        if self.method == "copy":
            firsts: dict[tuple[int, int], Entry] = {}
            singles = []
            for entry in files:
                key = (entry.dev, entry.ino)
                if key in firsts:
                    groups.append((entry, firsts[key]))  # hardlink group inside the source
                else:
                    firsts[key] = entry
                    singles.append(entry)
        # batches of equal work: a link weighs only its per-file cost, a copy its bytes; a
        # re-stage of the same method links most files (all hashes known): count them equally
        weight: Callable[[Entry], int] = (
            (lambda e: 0) if self.method == "hardlink"
            else (lambda e: 0 if e.hash is not None else e.size) if self.carry_over
            else (lambda e: e.size))
        processes = min(self.jobs, usable_cpus())
        if processes > 1 and len(singles) >= FORK_MIN_FILES:
            outcomes = map_parts(self._place_part, singles, processes, weight=weight)
        elif self.method == "copy" or any(self._link_from(e) is None for e in singles):
            outcomes = map_batched(self._place, singles, self.jobs, weight=weight)
        else:  # links only: threads would only contend for the GIL
            outcomes = self._place_part(singles)
        for entry, (outcome, size, content_hash) in zip(singles, outcomes, strict=True):
            if outcome == "unchanged":
                self.counts.unchanged += 1
                continue
            self.replaced.append(entry)
            if content_hash is not None:
                self.hashes[entry.path] = content_hash
            if outcome == "copied":
                self.counts.copied += 1
                self.counts.bytes_copied += size
            else:
                self.counts.linked += 1
        for entry, first in groups:
            os.link(os.path.join(scratch, first.path), os.path.join(scratch, entry.path))
            self.counts.linked += 1
        for entry in reversed(timed):  # children before parents
            dest = f"{scratch}/{entry.path}"
            os.utime(dest, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)
            if entry.type == "dir":
                os.chmod(dest, entry.mode)

    def _link_from(self, entry: Entry) -> tuple[int, str, str] | None:
        """Where ``entry`` is linked from when that link is all there is to do: (directory
        fd, name in it, outcome) — the source file (``hardlink``) or the pool entry of an
        unchanged file (``pool``); None when :meth:`_place` must decide."""
        if entry.path == "config.json":  # may be written as a private copy
            return None
        if self.method == "hardlink":
            before = self.previous.get(entry.path)
            same = self.carry_over and before is not None and before.same_stat(entry)
            return self._source_fd, entry.path, "unchanged" if same else "linked"
        if self.method == "pool" and self.carry_over and entry.hash is not None:
            before = self.previous.get(entry.path)
            if before is not None and before.same_content(entry):
                key = pool_key(entry.hash, entry.mode)
                return self._pool_fd, f"{key[:2]}/{key}", "unchanged"
        return None

    def _place_part(self, part: Sequence[Entry]) -> list[tuple[str, int, str | None]]:
        """:meth:`_place` for a slice of the files (in a forked worker, or here), with the
        common case — one ``link()`` from the source or the pool — done through directory
        descriptors: no per-file path walk down the scratch tree, no per-file decisions
        beyond a dict lookup."""
        results: list[tuple[str, int, str | None]] = []
        dest_dir, dest_fd = None, -1
        try:
            for entry in part:
                plan = self._link_from(entry)
                if plan is None:
                    results.append(self._place(entry))
                    continue
                src_fd, src_name, outcome = plan
                rel_dir, _, name = entry.path.rpartition("/")
                if rel_dir != dest_dir:
                    if dest_fd >= 0:
                        os.close(dest_fd)
                        dest_fd = -1
                    # our own scratch tree: every directory in it was made by build()
                    dest_fd = os.open(rel_dir or ".", _DIR_NOFOLLOW, dir_fd=self._scratch_fd)
                    dest_dir = rel_dir
                try:
                    os.link(src_name, name, src_dir_fd=src_fd, dst_dir_fd=dest_fd,
                            follow_symlinks=False)
                except FileNotFoundError:
                    if src_fd != self._pool_fd:
                        raise
                    results.append(self._place(entry))  # released meanwhile: copy again
                    continue
                results.append((outcome, 0, None))
        finally:
            if dest_fd >= 0:
                os.close(dest_fd)
        return results

    def _place(self, entry: Entry) -> tuple[str, int, str | None]:
        """Put one regular file into the scratch tree; returns (what happened, bytes copied,
        the content hash if it was computed here). Runs in forked workers: it changes no
        state of the builder but the copier's and the old-version descriptors' caches."""
        src = f"{self._source_text}/{entry.path}"
        dest = f"{self._scratch_text}/{entry.path}"
        before = self.previous.get(entry.path)
        # hardlink versions carry no content hashes: the source inode itself is staged
        same = self.carry_over and before is not None and (
            before.same_stat(entry) if self.method == "hardlink" else before.same_content(entry))
        if same and self.method == "copy" and self._carry_over(entry, dest):
            return "unchanged", 0, None
        if same and entry.path == "config.json" and self.method != "copy" \
                and self._carry_over(entry, dest):
            return "unchanged", 0, None
        if same and self.method == "hardlink":  # the previous version linked this very file
            os.link(src, dest, follow_symlinks=False)
            return "unchanged", 0, None
        if same and self.method == "pool":  # linked from the pool, as before
            assert entry.hash is not None
            self.pool.link_into(src, pool_key(entry.hash, entry.mode), entry.mode,
                                entry.mtime_ns, dest, self.copier)
            return "unchanged", 0, None
        if entry.path == "config.json":
            written = self._private_config(src, dest, entry, shared=self.method != "copy")
            if written is not None:
                return "copied", written, hash_file(src) if entry.hash is None else None
        if self.method == "hardlink":
            os.link(src, dest, follow_symlinks=False)
            return "linked", 0, None
        if self.method == "pool" and entry.hash is None:  # first stage: copy + hash at once
            content_hash, new = self.pool.ingest(src, entry.mode, entry.mtime_ns, dest,
                                                 entry.size)
            return ("copied", entry.size, content_hash) if new else ("linked", 0, content_hash)
        if self.method == "pool":
            assert entry.hash is not None
            if self.pool.link_into(src, pool_key(entry.hash, entry.mode), entry.mode,
                                   entry.mtime_ns, dest, self.copier):
                return "copied", entry.size, None
            return "linked", 0, None
        self.copier.copy_new(src, dest, entry.mode, entry.mtime_ns)
        return "copied", entry.size, None

    def _private_config(self, src: str, dest: str, entry: Entry, shared: bool) -> int | None:
        """Write config.json as a file of its own: with a read-only root when the staged files
        are shared, writable again in a private copy of a bundle that was read-only only for
        sharing; its size, or None when the source's config.json can be staged as it is."""
        if entry.size > 16 << 20:
            return None
        with open(src, "rb") as file:
            data = readonly_config(file.read()) if shared else writable_config(file.read())
        if data is None:
            return None
        write_private(Path(dest), data)
        os.chmod(dest, entry.mode)
        return len(data)


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
    marker = read_existing_marker(final)
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
    records: list[Record] = []
    tree = walk_digest(source, records)
    if same_kind and not identity and marker is not None and marker.tree == tree:
        return StageResult(final, marker.files, 0, 0, marker.files, 0, lease.id, method)
    previous = load_manifest(final / MANIFEST_NAME) if marker is not None else None
    before = previous.by_path() if previous is not None else {}
    # unchanged files keep their hashes from the previous manifest (never read again)
    entries = entries_of(records, before if method != "hardlink" else None)
    del records
    pool = Pool.of_target(to)
    one_pass = method == "pool" and previous is None and pool.is_empty()
    # pool: each file is hashed while it is copied into an empty pool (one pass);
    # hardlink: the staged file is the source's inode, no hash is needed to stage it
    if not one_pass and method != "hardlink":
        entries, _hashed = fill_missing_hashes(source, entries, jobs)
    files = sum(1 for e in entries if e.type == "file")
    if method == "pool":
        pool.prepare()
    scratch = new_scratch(to, name)
    try:
        builder = _Builder(source, scratch, final, method, previous, pool, jobs, before)
        try:
            builder.build(entries)
        finally:
            builder.close()
        if builder.hashes:
            hashes = builder.hashes
            entries = [e if e.path not in hashes else e.with_hash(hashes[e.path])
                       for e in entries]
            entries = _hardlink_group_hashes(entries)
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
        remove_tree(os.fspath(replaced), processes)
        if previous is not None and previous.method == "pool":
            pool.release(_released_keys(previous, manifest, before, builder.replaced,
                                         builder.counts.unchanged))
    with contextlib.suppress(FileNotFoundError):
        (scratch.parent / f"{scratch.name}.owner").unlink()
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
    :meth:`_Builder.build`); ``before``: ``previous.by_path()``. :meth:`Pool.release` then
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
