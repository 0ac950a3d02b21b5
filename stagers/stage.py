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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cache.fsremove import remove_path
from cache.leases import Holder, Lease
from cache.store import fsync_dir
from stagers.copy import Copier
from stagers.filemanifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    Entry,
    Manifest,
    StageError,
    entries_digest,
    fill_hashes,
    hash_file,
    load_manifest,
    scan,
    stat_digest,
)
from stagers.markers import claim, default_holder, new_marker, record_bundle_use, release_if_unused
from stagers.parallel import map_batched, map_processes, usable_cpus
from stagers.pool import Pool, pool_key
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
                 previous: Manifest | None, pool: Pool, jobs: int) -> None:
        self.source = source
        self.scratch = scratch
        self._source_text = os.fspath(source)    # entry paths are appended per file
        self._scratch_text = os.fspath(scratch)
        self.final = final
        self.method = method
        self.previous = previous.by_path() if previous is not None else {}
        self.carry_over = previous is not None and previous.method == method
        self.pool = pool
        self.jobs = jobs
        self.counts = _Counts()
        self.copier = Copier()
        self.hashes: dict[str, str] = {}  # computed while copying (first stage into a pool)
        self._old_dirs: dict[str, int | None] = {}
        self._old_dirs_lock = threading.Lock()

    def close(self) -> None:
        for fd in self._old_dirs.values():
            if fd is not None:
                os.close(fd)
        self._old_dirs.clear()

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
        firsts: dict[tuple[int, int], Entry] = {}
        groups: list[tuple[Entry, Entry]] = []
        singles: list[Entry] = []
        for entry in files:
            key = (entry.dev, entry.ino)
            if self.method == "copy" and key in firsts:
                groups.append((entry, firsts[key]))  # hardlink group inside the source
            else:
                firsts.setdefault(key, entry)
                singles.append(entry)
        weight: Callable[[Entry], int] = (
            (lambda e: 0) if self.method == "hardlink" else (lambda e: e.size))
        processes = min(self.jobs, usable_cpus())
        if processes > 1 and len(singles) >= FORK_MIN_FILES:
            outcomes = map_processes(self._place, singles, processes, weight=weight)
        else:
            outcomes = map_batched(self._place, singles, self.jobs, weight=weight)
        for entry, (outcome, size, content_hash) in zip(singles, outcomes, strict=True):
            if content_hash is not None:
                self.hashes[entry.path] = content_hash
            if outcome == "copied":
                self.counts.copied += 1
                self.counts.bytes_copied += size
            elif outcome == "linked":
                self.counts.linked += 1
            else:
                self.counts.unchanged += 1
        for entry, first in groups:
            os.link(os.path.join(scratch, first.path), os.path.join(scratch, entry.path))
            self.counts.linked += 1
        for entry in reversed(timed):  # children before parents
            dest = f"{scratch}/{entry.path}"
            os.utime(dest, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)
            if entry.type == "dir":
                os.chmod(dest, entry.mode)

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
    # unchanged? a sealed source by its identity, anything else by one stat walk
    if (marker is not None and marker.method == method and marker.format == "dir"
            and ((identity and marker.sealed == identity)
                 or (not identity and marker.tree and marker.tree == stat_digest(source)))):
        return StageResult(final, marker.files, 0, 0, marker.files, 0, lease.id, method)
    previous = load_manifest(final / MANIFEST_NAME) if marker is not None else None
    entries = scan(source)
    pool = Pool.of_target(to)
    one_pass = method == "pool" and previous is None and pool.is_empty()
    # pool: each file is hashed while it is copied into an empty pool (one pass);
    # hardlink: the staged file is the source's inode, no hash is needed to stage it
    if not one_pass and method != "hardlink":
        entries, _hashed = fill_hashes(source, entries, previous, jobs)
    tree = entries_digest(entries)
    files = sum(1 for e in entries if e.type == "file")
    if method == "pool":
        pool.prepare()
    scratch = new_scratch(to, name)
    try:
        builder = _Builder(source, scratch, final, method, previous, pool, jobs)
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
        old = publish(scratch, final)
        fsync_dir(to)
    except BaseException:
        with contextlib.suppress(OSError):
            drop_scratch(scratch)
        raise
    if old is not None:
        remove_path(os.fspath(old))
        if previous is not None and previous.method == "pool":
            pool.release(_pool_keys(previous) - _pool_keys(manifest))
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


def _pool_keys(manifest: Manifest) -> set[str]:
    return {pool_key(e.hash, e.mode) for e in manifest.entries
            if e.type == "file" and e.hash is not None}


