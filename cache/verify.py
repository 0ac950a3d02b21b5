"""``cache verify``: re-hash every blob, check every ref and cached bundle, isolate what is bad.

- A blob whose content does not hash to its name, and any foreign file among the blobs, is
  moved (one ``rename()``) into ``CACHE/quarantine/`` for a post-mortem; ``cache gc`` deletes
  quarantined entries after a week.
- A ref that reaches a blob the cache no longer has (quarantined now, or lost earlier) can no
  longer be satisfied: it is dropped from ``index.json`` (only if it still points where it
  did), so the next pull fetches the image again.
- A cached bundle without a readable ``config.json`` or a ``rootfs/`` directory is quarantined.
- A snapshot whose entries changed since it was published (a write in place through a bundle
  linked to it: :mod:`ocistage.cache.snapshotfiles`) is quarantined, and so are the cached
  bundles that share a changed inode; one without a record of its files (made by an older
  ocistage) is removed. Either is made again from the verified blobs when next needed.

Leftovers of interrupted writes (temp files, partial downloads) are not corruption: they are
never visible at a final path, and ``cache gc`` removes them.

What the caller may not read (another member's snapshot of an image with 0700 directories,
root's private ``--no-rootless`` bundle, in a group-shared cache) cannot be checked: it is
listed as :class:`Unchecked`, never called changed or broken, and left as it is. An entry
that cannot be moved to the quarantine is reported as left in place, and verify goes on.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ocistage.cache.digest import Digest, hash_file
from ocistage.cache.dirtrust import user_name
from ocistage.cache.errors import StoreError
from ocistage.cache.inventory import Blob, Bundle, Ref, list_blobs, list_bundles, read_refs
from ocistage.cache.readback import open_own
from ocistage.cache.sizes import count, format_size
from ocistage.cache.snapshotfiles import check, linked_bundles
from ocistage.cache.snapshots import SnapshotInfo, list_snapshots, remove_snapshot
from ocistage.cache.store import Store, quarantine
from ocistage.cache.sweep import Sweep
from ocistage.errors import OcistageError

if TYPE_CHECKING:
    from ocistage.results import Renderer

ProblemKind = Literal["corrupt-blob", "foreign-file", "broken-ref", "broken-bundle",
                      "changed-snapshot", "changed-bundle", "unchecked-snapshot"]
NO_ACTION = "none (dry run)"


@dataclass(frozen=True)
class Problem:
    kind: ProblemKind
    name: str
    detail: str
    action: str          # what verify did about it


@dataclass(frozen=True)
class Unchecked:
    """What the caller may not read, so cannot check: another member's snapshot of an image
    with 0700 directories, root's private ``--no-rootless`` bundle. Not a problem: it is
    neither changed nor broken as far as anybody can tell, and stays as it is."""

    kind: Literal["bundle", "snapshot"]
    name: str
    owner_uid: int
    detail: str

    @property
    def owner(self) -> str:
        return user_name(self.owner_uid)


@dataclass(frozen=True)
class VerifyReport:
    blobs: int
    bytes: int
    refs: int
    bundles: int
    snapshots: int
    problems: tuple[Problem, ...]
    dry_run: bool
    unchecked: tuple[Unchecked, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """What ``cache verify --json`` prints."""
        return {**asdict(self), "ok": self.ok,
                "unchecked": [{**asdict(u), "owner": u.owner} for u in self.unchecked]}

    def render(self, out: Renderer) -> None:
        for problem in self.problems:
            out.line(f"{problem.kind}: {problem.name}: {problem.detail}; {problem.action}")
        for item in self.unchecked:
            out.line(f"cannot check {item.kind} {item.name} of {item.owner}: {item.detail}")
        out.line(f"checked {count(self.blobs, 'blob')} ({format_size(self.bytes)}), "
                 f"{count(self.refs, 'ref')}, {count(self.bundles, 'bundle')}, "
                 f"{count(self.snapshots, 'snapshot')}: "
                 f"{'ok' if self.ok else count(len(self.problems), 'problem')}")


def _hash(blob: Blob) -> Digest | str | None:
    """The digest of ``blob``'s content, or why it has none (a symlink or another non-file
    planted under a blob's name is never followed), or None if it is gone."""
    try:
        fd = os.open(blob.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None  # removed meanwhile (by a GC): nothing to verify
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink, not a file"
        raise
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a regular file"
        return hash_file(file, blob.digest.algorithm)


def _foreign_files(store: Store) -> list[Path]:
    """Files among the blobs that are no blob (not a digest name, not a writer's temp file)."""
    foreign: list[Path] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(store.blobs) as algorithms:
        for algorithm in algorithms:
            if algorithm.name not in ("sha256", "sha512"):
                foreign.append(Path(algorithm.path))
                continue
            with os.scandir(algorithm.path) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    try:
                        Digest.parse(f"{algorithm.name}:{entry.name}")
                    except OcistageError:
                        foreign.append(Path(entry.path))
                        continue
                    if not entry.is_file(follow_symlinks=False):
                        foreign.append(Path(entry.path))
    return foreign


def _bundle_problem(path: Path) -> str | None:
    try:
        fd, _ = open_own(path / "config.json", owners="group")
        with os.fdopen(fd, "rb") as file:
            config = json.loads(file.read(16 << 20))
    except (OSError, ValueError, OcistageError) as exc:
        return f"config.json is unreadable: {exc}"
    if not isinstance(config, dict):
        return "config.json is not a JSON object"
    if not (path / "rootfs").is_dir() or (path / "rootfs").is_symlink():
        return "rootfs/ is missing"
    return None


def verify(store: Store, jobs: int = 2, dry_run: bool = False) -> VerifyReport:
    """Check the whole cache (see the module docstring); with ``dry_run`` only report."""
    sweep: Sweep[Problem] = Sweep(dry_run)
    unchecked: list[Unchecked] = []
    blobs = list_blobs(store)
    _corrupt_blobs(sweep, store, blobs, jobs)
    _foreign(sweep, store)
    refs = read_refs(store)
    _broken_refs(sweep, store, refs)
    snapshots = _changed_snapshots(sweep, store, unchecked)
    bundles = list_bundles(store)
    _broken_bundles(sweep, store, bundles, unchecked)
    return VerifyReport(blobs=len(blobs), bytes=sum(b.size for b in blobs.values()),
                        refs=len(refs), bundles=len(bundles), snapshots=snapshots,
                        problems=tuple(sweep.records), dry_run=dry_run,
                        unchecked=tuple(unchecked))


def _quarantined(sweep: Sweep[Problem], store: Store, kind: ProblemKind, name: str, detail: str,
                 path: Path, label: str) -> None:
    """Report the problem and move ``path`` to the quarantine; one the caller may not move
    (a directory of another user that is not group-writable) is reported as left where it
    is, and the check goes on."""
    try:
        moved = sweep.run(partial(quarantine, store, path, label))
    except StoreError as exc:
        action = f"left in place ({exc.message}); its owner or root can quarantine it"
    else:
        action = NO_ACTION if moved is None else f"quarantined to {moved}"
    sweep.report(Problem(kind, name, detail, action))


def _corrupt_blobs(sweep: Sweep[Problem], store: Store, blobs: dict[Digest, Blob],
                   jobs: int) -> None:
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="verify") as pool:
        actual = dict(zip(blobs, pool.map(_hash, blobs.values()), strict=True))
    for digest, found in sorted(actual.items()):
        if found is not None and found != digest:
            why = f"content hashes to {found}" if isinstance(found, Digest) else found
            _quarantined(sweep, store, "corrupt-blob", str(digest), why, blobs[digest].path,
                         "blob")


def _foreign(sweep: Sweep[Problem], store: Store) -> None:
    for path in _foreign_files(store):
        _quarantined(sweep, store, "foreign-file", str(path.relative_to(store.root)),
                     "not a blob (its name is no digest, or it is no file)", path, "foreign")


def _broken_refs(sweep: Sweep[Problem], store: Store, refs: list[Ref]) -> None:
    """Drop the refs that need a blob the cache lacks (in a dry run: or one found corrupt,
    which is still there)."""
    corrupt = _corrupt_in_place(sweep)
    broken = [r for r in refs if r.missing or any(str(d) in corrupt for d in r.blobs)]
    if broken:
        sweep.run(partial(store.untag, lambda entry: any(ref.same_entry(entry)
                                                         for ref in broken)))
    action = NO_ACTION if sweep.dry_run else "dropped from index.json; pull the image again"
    for ref in broken:
        lacking = ", ".join(str(d) for d in ref.missing) or "a corrupt blob"
        sweep.report(Problem("broken-ref", f"{ref.name} ({ref.platform})", f"needs {lacking}",
                             action))


def _corrupt_in_place(sweep: Sweep[Problem]) -> set[str]:
    """The blobs found corrupt that are still in place: in a dry run all, else none."""
    if not sweep.dry_run:
        return set()
    return {p.name for p in sweep.records if p.kind == "corrupt-blob"}


def _broken_bundles(sweep: Sweep[Problem], store: Store, bundles: list[Bundle],
                    unchecked: list[Unchecked]) -> None:
    for bundle in bundles:
        owner = _unreadable_by_caller(bundle.path)
        if owner is not None:
            unchecked.append(Unchecked("bundle", bundle.key, owner,
                                       "only its owner may read it (a private bundle)"))
            continue
        detail = _bundle_problem(bundle.path)
        if detail is not None:
            _quarantined(sweep, store, "broken-bundle", bundle.key, detail, bundle.path,
                         "bundle")


def _unreadable_by_caller(path: Path) -> int | None:
    """The owner of the directory ``path`` if it is another user's that the caller may not
    read (root's 0700 bundle in a group-shared cache), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if st.st_uid == os.geteuid() or os.access(path, os.R_OK | os.X_OK, follow_symlinks=False):
        return None
    return st.st_uid


def _changed_snapshots(sweep: Sweep[Problem], store: Store,
                       unchecked: list[Unchecked]) -> int:
    """Check every snapshot against the record of its files (:func:`_check_snapshot`);
    returns how many were checked."""
    snapshots = list_snapshots(store)
    reported: set[Path] = set()  # a bundle shares the change of every snapshot built on it
    for info in snapshots:
        _check_snapshot(sweep, store, info, reported, unchecked)
    return len(snapshots)


def _check_snapshot(sweep: Sweep[Problem], store: Store, info: SnapshotInfo,
                    reported: set[Path], unchecked: list[Unchecked]) -> None:
    """A changed snapshot is quarantined with the cached bundles that share the change (not
    yet ``reported``), one without a record removed: either is made again from the verified
    blobs when next needed. One the caller may not read whole is ``unchecked``."""
    try:
        found = check(info.path)
    except PermissionError as exc:
        owner = os.lstat(info.path).st_uid if os.path.lexists(info.path) else -1
        unchecked.append(Unchecked("snapshot", str(info.chain_id), owner,
                                   f"you may not read all of it ({exc.strerror}: "
                                   f"{exc.filename or info.path})"))
        return
    except OSError as exc:
        if os.path.lexists(info.path):
            raise StoreError(f"cannot check snapshot {info.chain_id.short}: {exc}") from exc
        return  # removed meanwhile (by a GC, or a bundle that found it changed)
    if found is None:
        sweep.run(partial(remove_snapshot, store, info.chain_id))
        sweep.report(Problem("unchecked-snapshot", str(info.chain_id),
                             "no record of its files (made by an older ocistage)",
                             NO_ACTION if sweep.dry_run else
                             "removed; made again from the verified blobs when needed"))
        return
    if found.unchanged:
        return
    linked = [path for path in linked_bundles(store, info.path, found) if path not in reported]
    reported.update(linked)
    _quarantined(sweep, store, "changed-snapshot", str(info.chain_id), found.describe(),
                 info.path, "snapshot")
    for path in linked:
        _quarantined(sweep, store, "changed-bundle", path.name,
                     f"shares the changed files of snapshot {info.chain_id.short}", path,
                     "bundle")
