"""A changed tree re-staged through the pool in one pass: the walk's workers place what they walked.

A re-stage of a tree that is not sealed first walks it (:mod:`ocistage.stagers.statwalk`:
forked workers walk its subtrees and keep their records). When the digest says the tree
changed and the previous version was staged through the pool too, with a manifest in the
compact format, the workers are handed the second step here (:func:`place_subtrees`) instead
of sending their records back: each reads the previous entries of its own subtrees only
(:mod:`ocistage.stagers.manifestparts`), turns its records into entries (unchanged files keep
their hashes and xattr digests), hashes the files that changed, makes the directories,
symlinks and FIFOs, links every file (:meth:`ocistage.stagers.placers.PoolPlacer.place_part`:
the same checks as always), sets the times, and returns its part of the new manifest's body
and its counts. The stager makes the directories it listed itself (the top of the tree,
:func:`restage_through_pool`), in which the subtrees are made, before the workers start; while
they place, it reads the previous manifest, places the rest of what it listed and its share
of the subtrees, and starts the remover of the version this one replaces (not before: on a
busy node its start-up would take a CPU from the workers while they walk). Then it writes the
manifest in walk order and publishes.

Nothing big is built before the workers fork (they fork for the walk, before the previous
manifest is read), and nothing per file crosses a pipe: the records stay where they were
walked, the previous manifest is read in parts, and only the manifest's body comes back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from ocistage.cache.cpus import usable_cpus
from ocistage.cache.dirfds import DIR_READ
from ocistage.stagers.builder import FORK_MIN_FILES, Builder, Counts
from ocistage.stagers.filemanifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    Entry,
    EntryType,
    Manifest,
    Record,
    entries_of_fields,
    fill_missing_hashes,
    fill_xattrs,
    manifest_body,
    manifest_head,
    unreadable,
    walk,
)
from ocistage.stagers.manifestparts import PreviousParts, Seen
from ocistage.stagers.placers import CONFIG, PoolPlacer
from ocistage.stagers.pool import Pool, pool_key
from ocistage.stagers.released import released_keys
from ocistage.stagers.statwalk import StatWalk
from ocistage.stagers.target import Method, StageResult, write_private
from ocistage.stagers.transaction import Staging

#: a walk's record after its path: type, mode, size, mtime_ns, dev, ino, target, ctime_ns
_Stat = tuple[EntryType, int, int, int, int, int, str | None, int]
#: a previous entry: its :data:`_Stat` as it was then, hash, xattr digest, its number
_Before = tuple[_Stat, str, str, int]

#: the method of every version this module builds, and of the one it replaces
POOL = Method.POOL


@dataclass(frozen=True)
class PlaceJob:
    """What a worker needs to place the subtrees it walked (picklable: sent to each)."""

    source: Path
    scratch: Path
    final: Path
    pool: Path
    manifest: Seen               # the previous manifest, as the stager read it
    prefixes: tuple[str, ...]    # each subtree's relative path, by number


@dataclass
class Placed:
    """What one process placed: its parts of the new manifest's body by subtree number (or
    listing), its counts, and what the pool may lose."""

    bodies: dict[int, bytes] = field(default_factory=dict)
    entries: int = 0
    files: int = 0
    counts: Counts = field(default_factory=Counts)
    released: set[str] = field(default_factory=set)
    old_files: int = 0           # files of the previous version in the parts looked at
    refused: int = 0             # extended attributes the target refused

    def add(self, other: Placed) -> None:
        self.bodies.update(other.bodies)
        self.entries += other.entries
        self.files += other.files
        for name in ("copied", "linked", "unchanged", "bytes_copied"):
            setattr(self.counts, name, getattr(self.counts, name) + getattr(other.counts, name))
        self.released |= other.released
        self.old_files += other.old_files
        self.refused += other.refused


def restage_through_pool(staging: Staging, source: Path, label: str, identity: str,
                         walked: StatWalk, jobs: int) -> tuple[StageResult, int] | None:
    """Build and publish the new version of the changed tree ``walked`` (its workers still
    keep their subtrees) through the pool; returns the result and how many extended
    attributes the target refused. None, with nothing done, when this way does not apply
    (no compact manifest of a pool version: the caller takes the general way)."""
    head = PreviousParts.head(staging.final / MANIFEST_NAME)
    if head is None or not walked.kept or head[0] != POOL.value:
        return None
    staging.use_pool()
    scratch = staging.scratch(remover=False)  # started once the workers place (below)
    job = PlaceJob(source, scratch, staging.final, Pool.of_target(staging.to).root, head[1],
                   walked.prefixes)
    # The workers' subtrees are made in the directories the stager listed (the top of the
    # tree): those are made first, and the workers start at once. The stager reads the
    # previous manifest, places the rest of what it listed and then its share of the
    # subtrees, and starts the remover of the version this one replaces meanwhile.
    listed = [(n, rows) for n, rows in enumerate(walked.pieces) if isinstance(rows, list)]
    _make_listed_dirs(scratch, listed)
    own: list[tuple[Placed, list[Record]]] = []

    def mine(subtrees: dict[int, list[Record]], claim: Callable[[int], bool]) -> Placed:
        previous = _previous_parts(job)
        own.append(_place(job, [
            (-1 - n, rows, previous.part(_listed_prefix(rows), False, len(rows))
             if rows and previous is not None else []) for n, rows in listed], dirs_made=True))
        if previous is not None:
            previous.rewind()  # the subtrees, in walk order again
        share = _place_subtrees(job, subtrees, claim, previous)
        staging.start_remover()
        return share

    parts = walked.then(place_subtrees, job, mine)
    placed, timed = own[0]
    for part in parts:
        placed.add(part)
    _set_times(job, timed)
    released: set[str] | None = placed.released
    marker = staging.marker
    if marker is None or placed.old_files != marker.files:  # previous files not seen
        released = None
    files = placed.files
    bodies = [placed.bodies[-1 - n if isinstance(piece, list) else piece]
              for n, piece in enumerate(walked.pieces)]
    write_private(scratch / MANIFEST_NAME,
                  [manifest_head(identity, POOL.value, True, placed.entries), *bodies])
    write_private(scratch / MARKER_NAME, staging.new_marker(
        label, POOL.value, tree=walked.digest, sealed=identity, files=files).to_json())
    if released is None:  # a directory of the previous version is gone: compare all
        released = _all_released(staging, scratch)
    staging.publish(scratch, min(jobs, usable_cpus()) if files >= FORK_MIN_FILES else 1,
                    released)
    counts = placed.counts
    return StageResult(staging.final, files, counts.copied, counts.linked, counts.unchanged,
                       counts.bytes_copied, staging.lease.id, POOL.value), placed.refused


def place_subtrees(job: PlaceJob, subtrees: dict[int, list[Record]],
                   claim: Callable[[int], bool]) -> Placed:
    """In a worker: place the subtrees it walked (``subtrees``: records by number), then
    those of the others not started yet (walked again here: a process that walked less does
    not wait for one that walked more); each subtree is claimed first (``claim``), so every
    one is placed once. Their previous entries are read from the manifest ``job.manifest``
    (:func:`_place_subtrees`)."""
    return _place_subtrees(job, subtrees, claim, _previous_parts(job))


def _previous_parts(job: PlaceJob) -> PreviousParts | None:
    """The previous manifest, read again by this process; None if it is no longer the file
    ``job.manifest`` (every file is then placed as a new one)."""
    found = PreviousParts.read(job.manifest.path, job.manifest)
    return found[0] if found is not None else None


def _place_subtrees(job: PlaceJob, subtrees: dict[int, list[Record]],
                    claim: Callable[[int], bool], previous: PreviousParts | None) -> Placed:
    """:func:`place_subtrees` with the previous manifest read (None: it is no longer the
    file ``job.manifest``, and every file is placed as a new one)."""

    def parts() -> Iterator[tuple[int, list[Record], list[str]]]:
        others = [n for n in range(len(job.prefixes)) if n not in subtrees]
        for n in [*sorted(subtrees), *reversed(others)]:  # the others from their end
            if not claim(n):
                continue
            prefix = job.prefixes[n]
            rows = subtrees[n] if n in subtrees else _walked(job.source, prefix)
            yield n, rows, previous.part(prefix, True, len(rows)) if previous else []

    placed, timed = _place(job, parts())
    _set_times(job, timed)
    return placed


def _walked(source: Path, prefix: str) -> list[Record]:
    """The records of the subtree ``prefix`` of ``source``, as the stat walk makes them."""
    try:
        return list(walk(f"{source}/{prefix}", prefix))
    except OSError as exc:
        raise unreadable(source, exc) from exc


def _make_listed_dirs(scratch: Path, listed: list[tuple[int, list[Record]]]) -> None:
    """Make the directories of the listings ``listed`` (in walk order: each one's parent
    first) in the private scratch directory, which holds nothing else yet."""
    scratch_fd = os.open(scratch, DIR_READ)
    try:
        for _n, rows in listed:
            for row in rows:
                if row[1] == "dir":
                    os.mkdir(row[0], 0o700, dir_fd=scratch_fd)
    finally:
        os.close(scratch_fd)


def _place(job: PlaceJob, parts: Iterable[tuple[int, list[Record], list[str]]],
           dirs_made: bool = False) -> tuple[Placed, list[Record]]:
    """Place ``parts`` (number, records in walk order, the previous entries' fields); returns
    what was placed and the records of the directories and symlinks made (their times are
    set last, :func:`_set_times`). ``dirs_made``: the parts' directories exist
    (:func:`_make_listed_dirs`)."""
    builder = Builder(job.source, job.scratch, job.final, POOL,
                      Manifest((), method=POOL.value), Pool(job.pool), 1, {})
    placed = Placed()
    timed: list[Record] = []
    try:
        placer = builder.placer
        assert isinstance(placer, PoolPlacer)
        scratch_fd = os.open(job.scratch, DIR_READ)
        try:
            for n, rows, fields in parts:
                placed.bodies[n] = _place_part(job, builder, placer, scratch_fd, rows, fields,
                                               placed, timed, dirs_made)
        finally:
            os.close(scratch_fd)
        counts = builder.counts
        placed.counts.copied += counts.copied
        placed.counts.linked += counts.linked
        placed.counts.unchanged += counts.unchanged
        placed.counts.bytes_copied += counts.bytes_copied
        placed.refused = placer.copier.xattrs_refused.value
    finally:
        builder.close()
    return placed, timed


def _place_part(job: PlaceJob, builder: Builder, placer: PoolPlacer, scratch_fd: int,
                rows: list[Record], fields: list[str], placed: Placed,
                timed: list[Record], dirs_made: bool = False) -> bytes:
    """Place the entries ``rows`` of one part beside the previous ones (``fields``); returns
    the part's body of the new manifest. An unchanged file (its stat, ctime included, as
    before) is linked from its pool entry by :meth:`PoolPlacer.link_unchanged`; every other
    one is made an :class:`Entry`, hashed if new or changed, and placed by
    :meth:`PoolPlacer.place_part` (which checks again)."""
    old, same = _previous(fields)
    kept_get = same.get
    link_unchanged, old_inodes = placer.link_unchanged, placer.old_inodes
    others: list[int] = []  # rows whose manifest entry is not the previous one
    unchanged = 0
    current: str | None = None
    dest = -1
    inodes: dict[str, int] | None = None
    try:
        for number, row in enumerate(rows):
            rel, kind = row[0], row[1]
            rel_dir, _, name = rel.rpartition("/")
            if rel_dir != current:
                if dest >= 0:
                    os.close(dest)
                    dest = -1
                dest = os.open(rel_dir or ".", DIR_READ, dir_fd=scratch_fd)
                current, inodes = rel_dir, None
            if kind == "file":
                kept = kept_get(row)  # the same record as before: stat and ctime
                if kept is not None and kept[0] and kept[1] != "?" and rel != CONFIG:
                    if inodes is None:
                        inodes = old_inodes(rel_dir)
                    was = inodes.get(name)
                    mode = row[2]
                    if was is not None and link_unchanged(
                            name, pool_key(kept[0], mode, kept[1]), was, mode, row[3], dest):
                        unchanged += 1
                        continue
                others.append(number)
                continue
            if kind == "dir":
                if not dirs_made:
                    os.mkdir(name, 0o700, dir_fd=dest)
                timed.append(row)
            elif kind == "symlink":
                assert row[7] is not None
                os.symlink(row[7], name, dir_fd=dest)
                timed.append(row)
            elif kind == "fifo":
                os.mkfifo(name, row[2], dir_fd=dest)
            if row not in same:
                others.append(number)
    finally:
        if dest >= 0:
            os.close(dest)
    made = _place_others(job, builder, placer, rows, others, fields, old)
    builder.counts.unchanged += unchanged
    placed.entries += len(rows)
    placed.files += unchanged + sum(1 for entry in made.values() if entry.type == "file")
    old_files = fields[1::11].count("file")
    placed.old_files += old_files
    placed.released |= _released(rows, fields, old, made, unchanged, old_files)
    return _body(rows, fields, old, made)


def _previous(fields: list[str]) -> tuple[dict[str, _Before], dict[Record, tuple[str, str]]]:
    """The previous entries by path: (the part of a walk's record after the path, as it
    was then; hash; xattr digest; the entry's number); and the hash and xattr digest by
    the whole record as the walk made it then (a record found there is unchanged, ctime
    included: one lookup)."""
    try:
        modes, sizes, mtimes, devs, inodes, ctimes = (list(map(int, fields[n::11]))
                                                      for n in (2, 3, 4, 5, 6, 9))
    except ValueError:
        return {}, {}
    paths = fields[0::11]
    kinds = cast(list[EntryType], fields[1::11])
    targets = [target or None for target in fields[8::11]]
    hashes, digests = fields[7::11], fields[10::11]
    stats = zip(kinds, modes, sizes, mtimes, devs, inodes, targets, ctimes, strict=True)
    old = dict(zip(paths, zip(stats, hashes, digests, range(len(paths)), strict=True),
                   strict=True))
    records = zip(paths, kinds, modes, sizes, mtimes, devs, inodes, targets, ctimes,
                  strict=True)
    return old, dict(zip(records, zip(hashes, digests, strict=True), strict=True))


def _place_others(job: PlaceJob, builder: Builder, placer: PoolPlacer, rows: list[Record],
                  others: list[int], fields: list[str],
                  old: dict[str, _Before]) -> dict[int, Entry]:
    """The entries of the rows ``others`` (by number), their files placed: a file keeps its
    previous hash while its stat is as before, and its xattr digest while its ctime is too
    (as :func:`~ocistage.stagers.filemanifest.entries_of`); the rest is read."""
    entries: list[Entry] = []
    previous: dict[str, Entry] = {}
    for number in others:
        row = rows[number]
        rel, kind, mode, size, mtime_ns, dev, ino, target, ctime_ns = row
        content_hash = xattrs = None
        before = old.get(rel)
        if kind == "file" and before is not None:
            at = before[3] * 11
            previous[rel] = entries_of_fields(fields[at:at + 11])[0]
            if before[0][:6] == row[1:7]:  # Entry.same_stat
                content_hash = before[1] or None
                if before[0][7] == ctime_ns and before[2] != "?":
                    xattrs = before[2]
        entries.append(Entry(rel, kind, mode, size, mtime_ns, dev, ino, content_hash, target,
                             ctime_ns, xattrs))
    entries = fill_xattrs(job.source, entries)
    entries, _hashed = fill_missing_hashes(job.source, entries, jobs=1)
    files = [entry for entry in entries if entry.type == "file"]
    placer.previous = previous
    builder.count(files, placer.place_part(files))
    return dict(zip(others, entries, strict=True))


def _released(rows: list[Record], fields: list[str],
              old: dict[str, _Before], made: dict[int, Entry],
              unchanged: int, old_files: int) -> set[str]:
    """Pool keys of the previous files of this part that the new version has not at the same
    path with the same content (:func:`ocistage.stagers.released.released_keys`)."""
    keys = set()
    kept = unchanged
    for entry in made.values():
        before = old.get(entry.path)
        if entry.type != "file" or before is None or before[0][0] != "file":
            continue
        kept += 1
        if before[1] and (before[1], before[0][1], before[2]) != (
                entry.hash, entry.mode, "?" if entry.xattrs is None else entry.xattrs):
            keys.add(pool_key(before[1], before[0][1], None if before[2] == "?"
                              else before[2]))
    if kept != old_files:  # some previous file is gone, or no file any more
        now = {row[0] for row in rows if row[1] == "file"}
        for path, (stats, content_hash, xattrs, _number) in old.items():
            if stats[0] == "file" and content_hash and path not in now:
                keys.add(pool_key(content_hash, stats[1], None if xattrs == "?" else xattrs))
    return keys


def _body(rows: list[Record], fields: list[str],
          old: dict[str, _Before], made: dict[int, Entry]) -> bytes:
    """This part's body of the new manifest: the previous entries' fields where they are
    unchanged, the entries ``made`` where not."""
    if not rows:
        return b""
    if len(rows) * 11 == len(fields) and [row[0] for row in rows] == fields[0::11]:
        out = fields  # the same paths in the same order: only the changed entries differ
        for number, entry in made.items():
            out[number * 11:number * 11 + 11] = _fields(entry)
    else:
        out = []
        for number, row in enumerate(rows):
            if number in made:
                out.extend(_fields(made[number]))
            else:
                at = old[row[0]][3] * 11
                out.extend(fields[at:at + 11])
    return ("\0".join(out) + "\0").encode("utf-8", "surrogatepass")


def _fields(entry: Entry) -> list[str]:
    """The eleven fields of ``entry`` in a compact manifest
    (:func:`~ocistage.stagers.filemanifest.manifest_body`)."""
    return manifest_body([entry]).decode("utf-8", "surrogatepass").split("\0")[:11]


def _set_times(job: PlaceJob, timed: list[Record]) -> None:
    """The times (and directory modes) of the records ``timed``, children first."""
    builder_times = Builder.set_times_of
    builder_times(os.fspath(job.scratch), [
        Entry(rel, kind, mode, size, mtime_ns, dev, ino, None, target, ctime_ns)
        for rel, kind, mode, size, mtime_ns, dev, ino, target, ctime_ns in timed])


def _listed_prefix(rows: list[Record]) -> str:
    """The relative path (ending in "/", "" at the top) of the directory ``rows`` list."""
    parent = rows[0][0].rpartition("/")[0]
    return f"{parent}/" if parent else ""


def _all_released(staging: Staging, scratch: Path) -> set[str]:
    """The pool keys of every file of the previous version that the new one (its manifest
    in ``scratch``) has not at the same path with the same content."""
    previous = staging.previous()
    current = Manifest.from_bytes((scratch / MANIFEST_NAME).read_bytes())
    if previous is None:
        return set()
    return released_keys(previous, current, previous.by_path(), [], 0)
