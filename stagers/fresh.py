"""A first stage: walk the source and fill the scratch tree in one pass, on every CPU.

With no previous version there is nothing to compare with, so placing files need not wait
for a whole walk. This process lists the directories (names and ``d_type`` only, no ``lstat``
of the files in them), which fixes the order of the manifest, and creates the directories
in the scratch tree; every other entry goes, in runs of consecutive ones, through a queue to
forked workers (:func:`ocistage.stagers.parallel.map_queue`). A worker stats its entries and
places them with the :class:`~ocistage.stagers.builder.Builder`, so stat calls, copies, hashes and
links all run in parallel. The result is the list of entries
:func:`~ocistage.stagers.filemanifest.walk`
and :func:`~ocistage.stagers.filemanifest.entries_of` give, in the same order, and so the same tree
digest that a later re-stage compares with.

A source that changes while it is staged gives what a walk at some moment during the stage
would have seen of each entry, as the two-pass stage does; an entry that turns into a
directory meanwhile is an error (stage again).
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Sequence
from functools import partial
from typing import Any

from ocistage.cache.dirfds import DIR_FOLLOW
from ocistage.stagers import xattrs
from ocistage.stagers.builder import FORK_MIN_FILES, Builder, Outcome
from ocistage.stagers.errors import StageError
from ocistage.stagers.filemanifest import (
    Entry,
    entries_digest,
    entry_type,
    fill_missing_hashes,
    hash_file,
    listing,
    unreadable,
)
from ocistage.stagers.parallel import MAX_QUEUE, map_queue

#: runs per process in the queue: enough for a worker that drew big files to take fewer runs
RUNS_PER_PROCESS = 16
MIN_RUN = 64

#: one entry to stat and place: its position in the walk order, its relative path
_Pending = tuple[int, str]


def build_first(builder: Builder, processes: int, hash_first: bool) -> tuple[list[Entry], str]:
    """Walk the builder's source and build its scratch tree (no previous version); returns
    the entries in walk order and their tree digest (:func:`entries_digest`). Counts and the
    hashes computed while copying end up in ``builder`` as with :meth:`Builder.build`.

    ``hash_first``: hash each file before placing it (a pool that has content already: only
    what it lacks is copied); otherwise files are placed as they are (hardlinks, or copies
    hashed on the way into an empty pool). A tree of fewer than ``FORK_MIN_FILES`` entries
    is stat'ed here and built by :meth:`Builder.build` (threads for big files).
    """
    source = os.fspath(builder.source)
    try:
        order, pending = _shape(source, builder.reads_xattrs)
        small = processes <= 1 or len(pending) < FORK_MIN_FILES
        if small:
            stated = _stat_run(source, pending, builder.reads_xattrs)
            for (position, _rel), entry in zip(pending, stated, strict=True):
                order[position] = entry
    except OSError as exc:
        raise unreadable(source, exc) from exc
    if small:
        return _build_here(builder, [e for e in order if e is not None], hash_first)
    return _build_forked(builder, order, pending, processes, hash_first)


def _build_here(builder: Builder, entries: list[Entry], hash_first: bool,
                ) -> tuple[list[Entry], str]:
    """:func:`build_first` of a small tree, its ``entries`` stat'ed: :meth:`Builder.build`."""
    if hash_first:
        entries, _hashed = fill_missing_hashes(builder.source, entries, builder.jobs)
    builder.build(entries)
    entries = builder.with_hashes(entries)
    return entries, entries_digest(entries)


def _build_forked(builder: Builder, order: list[Entry | None], pending: list[_Pending],
                  processes: int, hash_first: bool) -> tuple[list[Entry], str]:
    """:func:`build_first` of a big tree by :func:`_shape`'s ``order`` and ``pending``: the
    directories made here, the runs of other entries stat'ed and placed by ``processes``
    forked workers."""
    directories = [entry for entry in order if entry is not None]
    builder.make_nodes(directories)
    size = max(MIN_RUN, math.ceil(len(pending) / (processes * RUNS_PER_PROCESS)),
               math.ceil(len(pending) / MAX_QUEUE))
    runs = [pending[n:n + size] for n in range(0, len(pending), size)]
    work = partial(_stat_and_place, builder, os.fspath(builder.source), hash_first)
    make = Entry._make
    for run, (rows, outcomes) in zip(runs, map_queue(work, runs, processes), strict=True):
        entries = [make(row) for row in rows]
        for (position, _rel), entry in zip(run, entries, strict=True):
            order[position] = entry
        builder.count([entry for entry in entries if entry.type == "file"], outcomes)
    builder.set_times(directories)
    result = [entry for entry in order if entry is not None]
    assert len(result) == len(order)
    return result, entries_digest(result)


def _shape(source: str, ctime: bool) -> tuple[list[Entry | None], list[_Pending]]:
    """The walk order of the tree under ``source``: directories as entries (``lstat`` here:
    the walk goes into them; with their ctime if ``ctime``), every other entry as None at its
    position, also listed with its relative path."""
    order: list[Entry | None] = []
    pending: list[_Pending] = []
    stack: list[tuple[str, str]] = [(source, "")]
    while stack:
        directory, prefix = stack.pop()
        subdirs: list[tuple[str, str]] = []
        for child in listing(directory, prefix):
            rel = prefix + child.name
            if child.is_dir(follow_symlinks=False):  # d_type: no stat call
                st = child.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    order.append(Entry(rel, "dir", stat.S_IMODE(st.st_mode), st.st_size,
                                       st.st_mtime_ns, st.st_dev, st.st_ino,
                                       ctime_ns=st.st_ctime_ns if ctime else 0))
                    subdirs.append((child.path, rel + "/"))
                    continue
            pending.append((len(order), rel))
            order.append(None)
        stack.extend(subdirs)
    return order, pending


def _stat_run(source: str, run: Sequence[_Pending], with_xattrs: bool) -> list[Entry]:
    """The entries of ``run`` (no directories: :func:`_shape` found those), each ``lstat``
    through a descriptor of its directory; ``with_xattrs``: with the ctime, and a file's
    xattr digest (not for hardlink staging, whose staged file is the source's inode and
    whose links move the source's ctimes: :func:`~ocistage.stagers.filemanifest.children`)."""
    entries = []
    current, fd = None, -1
    try:
        for _position, rel in run:
            rel_dir, _, name = rel.rpartition("/")
            if rel_dir != current:
                if fd >= 0:
                    os.close(fd)
                    fd = -1
                fd = os.open(f"{source}/{rel_dir}" if rel_dir else source, DIR_FOLLOW)
                current = rel_dir
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            kind = entry_type(st.st_mode)
            if kind == "dir":
                raise StageError(f"{source}/{rel} became a directory while it was being "
                                 "staged", "stage again once the source no longer changes")
            entries.append(Entry(
                rel, kind, stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, st.st_dev,
                st.st_ino, None, os.readlink(name, dir_fd=fd) if kind == "symlink" else None,
                st.st_ctime_ns if with_xattrs else 0, xattrs.digest(f"{source}/{rel}")
                if with_xattrs and kind == "file" else None))
    finally:
        if fd >= 0:
            os.close(fd)
    return entries


def _stat_and_place(builder: Builder, source: str, hash_first: bool, run: Sequence[_Pending],
                    ) -> tuple[list[tuple[Any, ...]], list[Outcome]]:
    """In a worker: the entries of ``run`` (:func:`_stat_run`, hashed first if asked), made
    in the scratch tree; returns them as rows, with the hashes computed while copying, and
    what placing each file did (:meth:`Builder.count` is the caller's: a forked worker's
    state is lost)."""
    entries = _stat_run(source, run, builder.reads_xattrs)
    if hash_first:
        entries = [entry.with_hash(hash_file(f"{source}/{entry.path}"))
                   if entry.type == "file" else entry for entry in entries]
    timed = builder.make_nodes(entries)
    files = [entry for entry in entries if entry.type == "file"]
    outcomes = builder.placer.place_part(files)
    builder.set_times(timed)
    hashes = {file.path: content_hash for file, (_outcome, _size, content_hash)
              in zip(files, outcomes, strict=True) if content_hash is not None}
    if hashes:  # computed while copying: into the entries here, in parallel
        entries = [entry.with_hash(hashes[entry.path]) if entry.path in hashes else entry
                   for entry in entries]
    # plain tuples: pickled and unpickled 3-5x faster than named tuples
    return [tuple(entry) for entry in entries], outcomes
