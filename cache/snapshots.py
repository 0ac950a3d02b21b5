"""Unpacked layer snapshots: the rootfs after layers 1..n, stored by ChainID.

A snapshot is the tree that applying an image's first ``n`` layers gives. It is keyed by the
image-spec *ChainID* of those layers (``ChainID(L1) = DiffID(L1)``,
``ChainID(L1..Ln) = sha256(ChainID(L1..Ln-1) + " " + DiffID(Ln))``), so two images that share
their base layers share the snapshot of that base, whatever their manifests say. For a
one-layer image the ChainID *is* the layer's diff_id. Layout::

    snapshots/<hex>/rootfs/          the tree, read-only by convention (nothing writes into it)
    snapshots/<hex>/snapshot.json    chain id, diff_ids, entry count, host and boot that made it
    snapshots/<hex>/snapshot.files   per entry: mode, owner, inode, size, mtime (snapshotfiles)
    snapshots/<hex>/snapshot.modes   the image's mode of each file kept owner-readable
                                     (snapshotmodes)

Invariants:

- ``snapshots/<hex>/`` is owner-only (0700): the image's setuid/setgid files and file
  capabilities in ``rootfs/`` are reachable by no other user (docs/trust.md). In a
  group-shared cache it is open to the group, and those privileges were taken from the files
  before it was published (:func:`strip_for_group`);
- a path under ``snapshots/`` exists only once every layer in it was applied and its diff_id
  verified, and each layer blob was verified against its digest: snapshots are built in a
  scratch dir of the store and published by ``rename()``;
- nothing ever writes into a published snapshot's files. Bundles and newer snapshots are made
  from it with hard links, and the layer applier never opens an existing file for writing (it
  replaces entries, it does not modify them), so applying layers on a linked clone leaves the
  original untouched. Someone else can: a write in place into a file of a linked bundle
  changes the snapshot. :func:`find_snapshot` checks every entry against the record made when
  the snapshot was published (:mod:`ocistage.cache.snapshotfiles`) before anything is made
  from it, and sets a changed one aside, so it is rebuilt from the verified blobs;
- a snapshot is not fsync-ed file by file (that would cost more than extracting it). It is
  trusted if it was made on another host (its writer closed every file, which flushes them on
  NFS), on this host in the current boot (the page cache is authoritative), or after an explicit
  sync. After a reboot of the host that made it, an unsynced snapshot is thrown away and rebuilt
  from the verified blobs: a power loss can never leave half-written files in use.

``cache gc`` lists snapshots with :func:`list_snapshots` and removes them with
:func:`remove_snapshot`; leases on ``snapshot:sha256:<hex>`` (the ChainID) protect one while a
command builds from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache import snapshotfiles, snapshotmodes
from ocistage.cache.atomicwrite import fsync_dir
from ocistage.cache.cpus import usable_cpus
from ocistage.cache.digest import Digest
from ocistage.cache.dirfds import open_parent
from ocistage.cache.errors import ForeignFile, StoreError, translate_oserror
from ocistage.cache.evict import Left, take_out
from ocistage.cache.fdio import write_new_file
from ocistage.cache.jsondoc import parse_json, read_document
from ocistage.cache.notice import Kind, Notice
from ocistage.cache.privatedirs import make_private
from ocistage.cache.privileges import strip_privileges, stripped_warning
from ocistage.cache.store import SNAPSHOTS, Store
from ocistage.cache.treeremoval import remove_tree
from ocistage.cache.treewalk import walk_dirs
from ocistage.errors import OcistageError

METADATA = "snapshot.json"
MAX_METADATA_BYTES = 1 << 20
SNAPSHOT_FORMAT = 1
MAX_KEPT_WARNINGS = 256   # a snapshot's metadata stays far below MAX_METADATA_BYTES
MAX_WARNING_CHARS = 1024


def chain_ids(diff_ids: Sequence[Digest]) -> list[Digest]:
    """The ChainID of every prefix of ``diff_ids`` (image-spec ``config.md``)."""
    chain: list[Digest] = []
    for diff_id in diff_ids:
        if not chain:
            chain.append(diff_id)
            continue
        text = f"{chain[-1]} {diff_id}".encode()
        chain.append(Digest("sha256", hashlib.sha256(text).hexdigest()))
    return chain


def lease_target(chain_id: Digest) -> str:
    """The lease target of the snapshot of ``chain_id``: the only place that spells it."""
    return f"snapshot:{chain_id}"


@dataclass(frozen=True)
class SnapshotInfo:
    """One published snapshot as ``cache ls``/``gc`` see it."""

    chain_id: Digest
    path: Path                 # snapshots/<hex> (the rootfs is path / "rootfs")
    diff_ids: tuple[Digest, ...]
    entries: int
    created: float            # seconds since the epoch
    last_used: float          # mtime of snapshot.json, touched whenever a bundle uses it

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"

    @property
    def target(self) -> str:
        """The lease target that protects this snapshot (:func:`lease_target`)."""
        return lease_target(self.chain_id)


def snapshot_dir(store: Store, chain_id: Digest) -> Path:
    return store.root / SNAPSHOTS / chain_id.hex


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _trusted(metadata: dict[str, object]) -> bool:
    """See the module docstring: unsynced snapshots of this host do not survive its reboot."""
    if metadata.get("synced") is True:
        return True
    if metadata.get("host") != os.uname().nodename:
        return True
    return metadata.get("boot_id") == _boot_id()


def _read_metadata(directory: Path) -> dict[str, object] | None:
    try:
        data = parse_json(read_document(directory / METADATA, MAX_METADATA_BYTES,
                                        owners="group"))
    except (OSError, ValueError, ForeignFile):  # a symlink or FIFO planted there: not ours
        return None
    return data if isinstance(data, dict) else None


class SnapshotUnreadable(StoreError):
    """A published snapshot the caller may not read whole (another member's, in a
    group-shared cache, of an image with 0700 directories): it cannot be checked or cloned
    by the caller, and is not changed either; the caller makes a tree of its own."""


def find_snapshot(store: Store, chain_id: Digest) -> Path | None:
    """The rootfs of the published snapshot ``chain_id``, or ``None``; raises
    :class:`SnapshotUnreadable` for one the caller may not read whole (left as it is).

    A snapshot that cannot be trusted any more (made before a reboot of this host, never
    synced), or whose files cannot be checked (no record of them: made by an older ocistage),
    is removed here, and one whose files changed since it was published (a write in place
    through a linked bundle) is quarantined with the cached bundles that share the change
    (:mod:`ocistage.cache.snapshotfiles`), so the caller rebuilds it.
    """
    directory = snapshot_dir(store, chain_id)
    metadata = _read_metadata(directory)
    if metadata is None:
        return None
    try:
        usable = _trusted(metadata) and _unchanged(store, directory)
    except PermissionError as exc:
        # another member's snapshot with directories only its maker may read (an image's
        # 0700 /root): it cannot be checked, nor cloned, by the caller; it is not changed,
        # and stays for its maker, while the caller makes a tree of its own
        raise SnapshotUnreadable(
            f"snapshot {chain_id.short} cannot be checked: you may not read all of it "
            f"({exc.strerror}: {exc.filename or directory})",
            "it is another member's; make a tree of your own") from exc
    if not usable:
        remove_snapshot(store, chain_id)
        return None
    with contextlib.suppress(OSError):
        os.utime(directory / METADATA)  # last use, for gc's age-based policies
    if not store.group_shared:
        with contextlib.suppress(OSError):
            make_private(directory)  # one made before snapshots were kept private
    return directory / "rootfs"


def strip_for_group(store: Store, rootfs: Path) -> tuple[Notice, ...]:
    """In a group-shared cache, take the image's setuid/setgid bits and file capabilities
    from the still private tree ``rootfs`` before the group may reach it
    (:func:`ocistage.cache.privileges.strip_privileges`); the warning saying how many files
    lost them. Nothing in a private cache, whose trees are kept in owner-only directories."""
    if not store.group_shared:
        return ()
    try:
        stripped = strip_privileges(rootfs)
    except OSError as exc:
        raise translate_oserror(exc, f"stripping set-id bits in {rootfs}") from exc
    return stripped_warning(stripped, "the cache is group-shared")


def _unchanged(store: Store, directory: Path) -> bool:
    """Whether the snapshot's entries are as it recorded them when it was published: one
    walk of its tree (``lstat`` of every entry, docs/performance.md); a changed one is set
    aside here. False also when there is no record or the tree is gone meanwhile."""
    try:
        found = snapshotfiles.check(directory)
    except PermissionError:
        raise  # cannot check: never "changed"
    except OSError:
        return False  # removed or set aside by another process meanwhile
    if found is None or found.unchanged:
        return found is not None
    snapshotfiles.set_aside(store, directory, found)  # StoreError if it cannot be moved
    return False


def snapshot_warnings(rootfs: Path) -> tuple[Notice, ...]:
    """What unpacking the layers of the snapshot at ``rootfs`` warned about (device nodes
    replaced, ...), as recorded when it was published: a bundle cloned from it reports them
    as the command that unpacked them did."""
    metadata = _read_metadata(rootfs.parent)
    kept = metadata.get("warnings") if metadata is not None else None
    if not isinstance(kept, list):
        return ()
    found = (_legacy_notice(item) if isinstance(item, str) else Notice.from_json(item)
             for item in kept)
    return tuple(notice for notice in found if notice is not None)


# how ocistage.bundler.unpack.apply worded a device node replaced by an empty file, when
# snapshots kept their warnings as plain text (before ocistage.cache.notice)
_LEGACY_DEVICE_SUFFIX = " replaced by an empty file (rootless)"


def _legacy_notice(text: str) -> Notice:
    """A warning a snapshot made by an earlier version kept as its text (``layer N: ...``)."""
    kind = Kind.DEVICE_NODE if text.endswith(_LEGACY_DEVICE_SUFFIX) else Kind.OTHER
    return Notice(kind, text)


def publish_snapshot(store: Store, scratch: Path, chain_id: Digest,
                     diff_ids: Sequence[Digest], entries: int,
                     warnings: Sequence[Notice] = (),
                     modes: Sequence[snapshotmodes.Mode] | None = None) -> Path:
    """Publish ``scratch`` (holding ``rootfs/``) as snapshot ``chain_id``; return its rootfs.

    ``warnings`` (what unpacking it said) are kept with it for :func:`snapshot_warnings`: the
    first :data:`MAX_KEPT_WARNINGS`, each text cut to :data:`MAX_WARNING_CHARS`. ``modes``:
    the image's modes of the files made owner-readable
    (:func:`ocistage.cache.snapshotmodes.keep_owner_readable`), kept for the copies of it;
    None: no record (the tree holds the image's modes as they are).

    If another process published the same snapshot first, ``scratch`` is removed and theirs
    is used: both were built from the same verified layers.
    """
    final = snapshot_dir(store, chain_id)
    metadata = {"format": SNAPSHOT_FORMAT, "chain_id": str(chain_id),
                "diff_ids": [str(d) for d in diff_ids], "entries": entries,
                "created": time.time(), "host": os.uname().nodename, "boot_id": _boot_id(),
                "synced": False,
                "warnings": [warning.to_json(MAX_WARNING_CHARS)
                             for warning in warnings[:MAX_KEPT_WARNINGS]]}
    try:
        if modes is not None:
            snapshotmodes.write_modes(scratch, modes)
        snapshotfiles.write_record(scratch)
        write_new_file(scratch / METADATA, (json.dumps(metadata, indent=2) + "\n").encode())
        os.chmod(scratch, store.tree_dir_mode())
        final.parent.mkdir(exist_ok=True)
        try:
            os.rename(scratch, final)
        except OSError:
            if _read_metadata(final) is None:
                raise
            remove_tree(scratch)
            return final / "rootfs"
        fsync_dir(final.parent)
    except OSError as exc:
        raise translate_oserror(exc, f"publishing snapshot {chain_id.short}") from exc
    return final / "rootfs"


def list_snapshots(store: Store) -> list[SnapshotInfo]:
    """Every published snapshot (unreadable or half-removed entries are skipped)."""
    root = store.root / SNAPSHOTS
    found: list[SnapshotInfo] = []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    for name in names:
        directory = root / name
        metadata = _read_metadata(directory)
        if metadata is None:
            continue
        raw_ids = metadata.get("diff_ids")
        try:
            chain_id = Digest.parse(str(metadata.get("chain_id")))
            diff_ids = tuple(Digest.parse(str(d))
                             for d in (raw_ids if isinstance(raw_ids, list) else []))
            last_used = (directory / METADATA).stat().st_mtime
        except (OSError, OcistageError):
            continue  # half-removed or hand-edited: skipped, never fatal
        if chain_id.hex != name:
            continue
        entries = metadata.get("entries", 0)
        created = metadata.get("created", 0.0)
        found.append(SnapshotInfo(chain_id, directory, diff_ids,
                                  entries if isinstance(entries, int) else 0,
                                  float(created) if isinstance(created, int | float) else 0.0,
                                  last_used))
    return found


def remove_snapshot(store: Store, chain_id: Digest) -> Left | None:
    """Unpublish snapshot ``chain_id`` (one rename, beside it) and delete its tree if the
    caller may (:mod:`ocistage.cache.evict`); no error if absent. Returns what stays evicted
    for its owner (another member's snapshot in a group-shared cache), or None.

    Bundles made from it by hard links keep their files: only the snapshot's names go.
    """
    return take_out("snapshot", chain_id.hex, snapshot_dir(store, chain_id))


def link_tree(source: Path, dest: Path, parts: int | None = None) -> None:
    """Make ``dest`` (absent) a copy of the trusted tree ``source``, hard-linking its files.

    Directories are new (with the source's modes, owners, xattrs and times); every other entry
    is a hard link to the source's inode. Used on snapshots, which are built by ocistage and
    never contain anything but directories, regular files, symlinks and FIFOs. GNU ``cp -al``
    does this in C (``-P``: symlinks are never followed), about twice as fast as a Python walk
    (measured). The work is kernel time per entry, so a large tree is split into disjoint
    subtrees of about equal weight, each cloned by a ``cp -al`` of its own, ``parts`` at once
    (default: :func:`free_cpus`; see :func:`split_tree`). Measured on 2 cores, ext4, 18k
    entries: 1.3x as fast with the second core idle, 1.15x slower with it busy
    (docs/performance.md).
    """
    _clone_tree(["-al"], source, dest, parts)


def copy_tree(source: Path, dest: Path, parts: int | None = None) -> None:
    """Make ``dest`` (absent) an independent copy of the trusted tree ``source``: ``cp -a
    --reflink=auto`` (a filesystem that shares extents, btrfs or XFS, copies no data), split
    like :func:`link_tree` into ``parts`` copies at once: a copy into tmpfs or the page cache
    is memory bandwidth and per-entry kernel time, both of which a second core adds to."""
    _clone_tree(["-a", "--reflink=auto"], source, dest, parts)


def _clone_tree(flags: list[str], source: Path, dest: Path, parts: int | None) -> None:
    if os.path.lexists(dest):  # cp would merge into it
        raise StoreError(f"cannot copy {source} to {dest}: it exists",
                         "remove it first, or choose a new destination")
    count = free_cpus() if parts is None else parts
    plan = split_tree(source, count) if count > 1 else None
    if plan is None:
        _cp([*flags, "--no-target-directory", "--", str(source), str(dest)], source, dest)
        return
    try:
        for rel in plan.dirs:  # parents first; writable until their entries are in
            os.mkdir(dest / rel if rel else dest, 0o700)
    except OSError as exc:
        raise translate_oserror(exc, f"copying {source} to {dest}") from exc
    _cp_parallel([[*flags, "--parents", "-t", str(dest), "--", *group]
                  for group in plan.groups], source, dest)
    try:
        for rel in reversed(plan.dirs):  # children first: a parent's mode may forbid entering
            _copy_dir_attributes(source / rel if rel else source, dest / rel if rel else dest)
    except OSError as exc:
        raise translate_oserror(exc, f"copying {source} to {dest}") from exc


# -- splitting a clone -----------------------------------------------------------------------

MAX_LINK_PARTS = 4
MIN_SPLIT_WEIGHT = 4000       # below this a single cp is as fast (the walk costs ~2 us/entry)
_DIR_WEIGHT = 8               # mkdir costs about 8 hard links on ext4 (strace -c of cp -al)
_MAX_SPLIT_DIRS = 256         # directories made here, one by one, before the copies start
_MAX_ARGV_BYTES = 512 * 1024  # per cp; a plan needing more is not used


@dataclass(frozen=True)
class TreeSplit:
    """How :func:`link_tree` clones a tree in parallel.

    ``dirs``: relative paths of the directories :func:`link_tree` makes itself (``""``: the
    root; parents before children); ``groups``: for each ``cp``, the relative paths of the
    entries it clones (whole subtrees, or single non-directories), disjoint.
    """

    dirs: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]


@dataclass
class _Dir:
    rel: str
    files: list[str]
    subdirs: list[_Dir]
    weight: int = 0


_PATH_MAX = 4096   # Linux's PATH_MAX: the longest path a system call takes
_PATH_MARGIN = 512  # for the destination's own path, which may be longer than the source's


def _scan(source: Path) -> _Dir:
    """Every directory under ``source`` with its non-directory entries: an fd-based walk
    (:func:`ocistage.cache.treewalk.walk_dirs`: any depth and path length, never following a
    link)."""
    parent_fd, name = open_parent(source)
    nodes: dict[str, _Dir] = {}
    order: list[_Dir] = []
    try:
        for rel, dirs, others in walk_dirs(parent_fd, name):
            node = nodes.pop(rel, None) or _Dir(rel, [], [])
            prefix = f"{rel}/" if rel else ""
            node.files.extend(prefix + other for other in others)
            for sub in dirs:
                child = _Dir(prefix + sub, [], [])
                node.subdirs.append(child)
                nodes[child.rel] = child  # filled when the walk reaches it
            order.append(node)
    finally:
        os.close(parent_fd)
    for node in reversed(order):  # children were found after their parents
        node.weight = _DIR_WEIGHT + len(node.files) + sum(d.weight for d in node.subdirs)
    return order[0]


def split_tree(source: Path, parts: int) -> TreeSplit | None:
    """Split the tree at ``source`` into ``parts`` groups of about equal weight, or ``None``
    when a single ``cp`` is the better choice (a small tree, an unreadable directory, a plan
    too large for a command line).

    The heaviest directory is expanded (made by :func:`link_tree`, its entries cloned one by
    one) until no subtree weighs more than an eighth of a group; the subtrees and loose
    entries are then dealt out, heaviest first, to the lightest group.
    """
    root = _scan_for_split(source) if parts >= 2 else None
    if root is None:
        return None
    dirs, units = _expand(root, limit=root.weight / parts / 8)
    groups = _deal(units, parts)
    if not _fits_command_lines(source, dirs, groups):
        return None
    return TreeSplit(tuple(node.rel for node in dirs),
                     tuple(tuple(group) for group in groups if group))


def _scan_for_split(source: Path) -> _Dir | None:
    """The scanned tree at ``source``, or None if it is no directory, cannot be scanned (cp
    reports that, as it did before the split existed) or is too light to be worth a split."""
    if not source.is_dir() or source.is_symlink():
        return None
    try:
        root = _scan(source)
    except OSError:
        return None
    return root if root.weight >= MIN_SPLIT_WEIGHT else None


def _expand(root: _Dir, limit: float) -> tuple[list[_Dir], list[tuple[int, str]]]:
    """Expand the heaviest directory until no subtree weighs more than ``limit`` (at least
    the root, at most :data:`_MAX_SPLIT_DIRS`); returns the expanded directories (a directory
    only after its parent) and the units left to clone: ``(weight, relative path)``."""
    dirs: list[_Dir] = []
    units: list[tuple[int, str]] = []
    heap: list[tuple[int, int, _Dir]] = [(-root.weight, 0, root)]
    serial = 0
    while heap and (-heap[0][0] > limit or not dirs) and len(dirs) < _MAX_SPLIT_DIRS:
        _weight, _n, node = heapq.heappop(heap)
        dirs.append(node)
        units.extend((1, rel) for rel in node.files)
        for child in node.subdirs:
            serial += 1
            heapq.heappush(heap, (-child.weight, serial, child))
    units.extend((-weight, node.rel) for weight, _n, node in heap)
    return dirs, units


def _deal(units: list[tuple[int, str]], parts: int) -> list[list[str]]:
    """Deal the units out, heaviest first, each to the group that is lightest so far."""
    groups: list[list[str]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for weight, rel in sorted(units, key=lambda unit: -unit[0]):
        lightest = loads.index(min(loads))
        groups[lightest].append(rel)
        loads[lightest] += weight
    return groups


def _fits_command_lines(source: Path, dirs: list[_Dir], groups: list[list[str]]) -> bool:
    """Whether every group fits one ``cp`` command line, and every planned path the kernel's
    PATH_MAX: one near it (a deep or long tree, which the fd-based scan lists) would fail in
    ``cp``, where a single recursive ``cp`` copies it."""
    if any(sum(len(os.fsencode(rel)) + 1 for rel in group) > _MAX_ARGV_BYTES
           for group in groups):
        return False
    longest = max(len(os.fsencode(rel)) for rel in (*(n.rel for n in dirs), *(
        rel for group in groups for rel in group)))
    return len(os.fsencode(str(source))) + longest + _PATH_MARGIN < _PATH_MAX


def _copy_dir_attributes(source: Path, dest: Path) -> None:
    """Owner, xattrs, mode and times of directory ``source`` onto ``dest``, as ``cp -a``
    does: owner and xattrs where permitted, mode and times always."""
    info = os.lstat(source)
    made = os.lstat(dest)
    if (made.st_uid, made.st_gid) != (info.st_uid, info.st_gid):
        with contextlib.suppress(PermissionError):
            os.chown(dest, info.st_uid, info.st_gid, follow_symlinks=False)
    with contextlib.suppress(OSError):
        for name in os.listxattr(source, follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.setxattr(dest, name, os.getxattr(source, name, follow_symlinks=False),
                            follow_symlinks=False)
    os.chmod(dest, stat.S_IMODE(info.st_mode))
    os.utime(dest, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)


def free_cpus() -> int:
    """The CPUs this process may use that nothing else runs on right now (1 to
    :data:`MAX_LINK_PARTS`): a split clone is slower than one ``cp`` on a busy machine."""
    cpus = usable_cpus()
    try:  # "0.52 0.58 0.59 3/143 ...": runnable tasks right now, this process's included
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return 1
    others = max(0, running - _own_running_threads())
    return max(1, min(MAX_LINK_PARTS, cpus - others))


def _own_running_threads() -> int:
    """Threads of this process that are runnable (state ``R``) right now; at least this one."""
    count = 0
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError, IndexError):
                text = Path(f"/proc/self/task/{task}/stat").read_text()
                count += text[text.rindex(")") + 2] == "R"
    return max(1, count)


# -- running cp ----------------------------------------------------------------------------------


def _cp_binary() -> str:
    return shutil.which("cp") or "/bin/cp"


def _cp(arguments: list[str], source: Path, dest: Path) -> None:
    result = subprocess.run([_cp_binary(), *arguments], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    if result.returncode != 0:
        raise _cp_error(result.stderr, source, dest)


def _cp_parallel(argument_lists: list[list[str]], source: Path, dest: Path) -> None:
    """Run one ``cp`` per argument list at once (in ``source``); the first failure raised."""
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for arguments in argument_lists:
            processes.append(subprocess.Popen(
                [_cp_binary(), *arguments], cwd=source, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        failures = []
        for process in processes:
            _out, err = process.communicate()
            if process.returncode != 0:
                failures.append(err)
    except OSError as exc:
        raise StoreError(f"cannot copy {source} to {dest}: {exc.strerror or exc}") from exc
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    if failures:
        raise _cp_error(failures[0], source, dest)


def _cp_error(stderr: bytes, source: Path, dest: Path) -> StoreError:
    message = stderr.decode(errors="replace").strip().splitlines()
    return StoreError(f"cannot copy {source} to {dest}: "
                      f"{message[-1] if message else 'cp failed'}")
