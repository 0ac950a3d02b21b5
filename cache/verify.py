"""``cache verify``: re-hash every blob, check every ref and cached bundle, isolate what is bad.

- A blob whose content does not hash to its name, and any foreign file among the blobs, is
  moved (one ``rename()``) into ``CACHE/quarantine/`` for a post-mortem; ``cache gc`` deletes
  quarantined entries after a week.
- A ref that reaches a blob the cache no longer has (quarantined now, or lost earlier) can no
  longer be satisfied: it is dropped from ``index.json`` (only if it still points where it
  did), so the next pull fetches the image again.
- A cached bundle without a readable ``config.json`` or a ``rootfs/`` directory is quarantined.

Leftovers of interrupted writes (temp files, partial downloads) are not corruption: they are
never visible at a final path, and ``cache gc`` removes them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ocistage.cache.digest import Digest, hash_file
from ocistage.cache.errors import OcistageError, StoreError
from ocistage.cache.inventory import QUARANTINE, Blob, list_blobs, list_bundles, read_refs
from ocistage.cache.readback import open_own
from ocistage.cache.store import Store

ProblemKind = Literal["corrupt-blob", "foreign-file", "broken-ref", "broken-bundle"]


@dataclass(frozen=True)
class Problem:
    kind: ProblemKind
    name: str
    detail: str
    action: str          # what verify did about it


@dataclass(frozen=True)
class VerifyReport:
    blobs: int
    bytes: int
    refs: int
    bundles: int
    problems: tuple[Problem, ...]
    dry_run: bool

    @property
    def ok(self) -> bool:
        return not self.problems


def quarantine(store: Store, path: Path, label: str) -> Path:
    """Move ``path`` into ``CACHE/quarantine`` (one rename); returns where it went."""
    directory = store.root / QUARANTINE
    destination = directory / f"{label}-{time.strftime('%Y%m%dT%H%M%S')}-{os.urandom(3).hex()}"
    try:
        directory.mkdir(exist_ok=True)
        os.rename(path, destination)
    except OSError as exc:
        raise StoreError(f"cannot quarantine {path}: {exc.strerror}") from exc
    return destination


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
    problems: list[Problem] = []
    blobs = list_blobs(store)
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="verify") as pool:
        actual = dict(zip(blobs, pool.map(_hash, blobs.values()), strict=True))
    for digest, found in sorted(actual.items()):
        if found is None or found == digest:
            continue
        action = "none (dry run)"
        if not dry_run:
            action = f"quarantined to {quarantine(store, blobs[digest].path, 'blob')}"
        why = f"content hashes to {found}" if isinstance(found, Digest) else found
        problems.append(Problem("corrupt-blob", str(digest), why, action))
    for path in _foreign_files(store):
        action = "none (dry run)" if dry_run else \
            f"quarantined to {quarantine(store, path, 'foreign')}"
        problems.append(Problem("foreign-file", str(path.relative_to(store.root)),
                                "not a blob (its name is no digest, or it is no file)", action))
    refs = read_refs(store)
    if dry_run:
        bad_digests = {p.name for p in problems if p.kind == "corrupt-blob"}
        broken = [r for r in refs if r.missing or any(str(d) in bad_digests for d in r.blobs)]
    else:
        broken = [r for r in refs if r.missing]
    if broken and not dry_run:
        store.untag(lambda entry: any(ref.same_entry(entry) for ref in broken))
    for ref in broken:
        lacking = ", ".join(str(d) for d in ref.missing) or "a corrupt blob"
        problems.append(Problem("broken-ref", f"{ref.name} ({ref.platform})",
                                f"needs {lacking}",
                                "none (dry run)" if dry_run else "dropped from index.json; "
                                "pull the image again"))
    bundles = list_bundles(store)
    for bundle in bundles:
        detail = _bundle_problem(bundle.path)
        if detail is None:
            continue
        action = "none (dry run)" if dry_run else \
            f"quarantined to {quarantine(store, bundle.path, 'bundle')}"
        problems.append(Problem("broken-bundle", bundle.key, detail, action))
    return VerifyReport(blobs=len(blobs), bytes=sum(b.size for b in blobs.values()),
                        refs=len(refs), bundles=len(bundles), problems=tuple(problems),
                        dry_run=dry_run)
