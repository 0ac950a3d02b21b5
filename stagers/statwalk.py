"""The stat walk of a source tree, its subtrees walked by forked workers.

A re-stage decides "unchanged?" from one ``lstat`` of every entry of the source
(:func:`ocistage.stagers.filemanifest.walk_digest`). For 100k entries that walk is ~0.5 s of Python
around the syscalls on one core, longer than ``rsync -a`` with nothing to do (whose sender and
receiver walk at once, in C). :func:`parallel_walk_digest` gives the same digest and the same
records in the same order, with the subtrees of the top of the tree handed out to
``processes`` forked workers (:func:`ocistage.stagers.parallel.map_queue`, this process being one).

The walk order (:func:`ocistage.stagers.filemanifest.walk`) is a directory's listing, then the
subtrees of its subdirectories, the last name first; so the tree's digest stream is the lines of the
top directory's records followed by each subtree's stream, in that order. This module expands
the top of the tree breadth first into such a sequence of pieces (records listed here, and
subtrees to walk), walks the subtrees in parallel, each worker returning its subtree's digest
lines and records, and feeds the pieces to one hasher in order.

Most re-stages find the tree unchanged and never look at the records. So a worker hands its
records back as one ``marshal`` blob (dumped in 8 ms for 50k records, where pickling the list
took 23 ms), which is loaded only when :meth:`StatWalk.records` is asked for (20 ms, where
unpickling took 25-32 ms): on an unchanged 100k-entry tree the walk's critical path loses
~45 ms of its ~320.
"""

from __future__ import annotations

import marshal
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import xxhash

from ocistage.stagers.filemanifest import (
    Record,
    children,
    digest_lines,
    unreadable,
    walk,
    walk_digest,
)
from ocistage.stagers.parallel import MAX_QUEUE, Second, TwoSteps, queue_in_two_steps

V = TypeVar("V")
X = TypeVar("X")

#: subtrees per process wanted: enough for a worker that drew a big one to take fewer
SUBTREES_PER_PROCESS = 16
#: how deep the top is expanded at most (each level is listed by this process alone): a
#: bundle is ``rootfs/`` and often ``rootfs/usr/`` before it fans out (measured, a 16.7k-entry
#: bundle: 3 levels gave one subtree, 6 give 68 and walk in 0.07 s instead of 0.12 s)
MAX_EXPAND_DEPTH = 6
#: fewer subdirectories than this at the top: a small tree, walked here (forking costs more)
MIN_PARALLEL_DIRS = 16


@dataclass(frozen=True)
class _Subtree:
    """A directory still to walk: its path and its relative prefix (ending in ``/``)."""

    path: str
    prefix: str
    ctime: bool = True


_Piece = list[Record] | _Subtree


class StatWalk:
    """A walk's stat digest, and its records in walk order when they are asked for (a
    changed tree). The subtrees that forked workers walked stay with them (:attr:`pieces`
    gives their numbers): :meth:`records` fetches them (``marshal`` blobs), :meth:`then`
    hands the workers a second step instead (they place what they walked:
    :mod:`ocistage.stagers.restage`), and :meth:`close` (or leaving the ``with``) ends them."""

    def __init__(self, digest: str, pieces: list[list[Record] | int],
                 steps: TwoSteps[bytes, list[Record]] | None = None,
                 prefixes: tuple[str, ...] = ()) -> None:
        self.digest = digest
        #: the walk in order: records listed here, and numbers of subtrees a worker keeps
        self.pieces = pieces
        #: the relative path (ending in "/") of each subtree a worker keeps, by number
        self.prefixes = prefixes
        self._steps = steps

    @property
    def kept(self) -> bool:
        """Whether workers keep subtrees of the walk (:meth:`then` may be called)."""
        return self._steps is not None

    def records(self) -> list[Record]:
        """Every record in walk order (the workers' fetched, which ends them)."""
        blobs: dict[int, bytes] = {}
        if self._steps is not None:
            steps, self._steps = self._steps, None
            for part in steps.then(_dumped, None):
                blobs.update(part)
        records: list[Record] = []
        for piece in self.pieces:
            records.extend(marshal.loads(blobs[piece]) if isinstance(piece, int) else piece)
        return records

    def then(self, second: Second[V, list[Record], X], argument: V,
             mine: Callable[[dict[int, list[Record]], Callable[[int], bool]], X]) -> list[X]:
        """``second(argument, subtrees, claim)`` in every worker, with the subtrees it walked
        by number, and ``mine(subtrees, claim)`` here (:meth:`TwoSteps.then`); ends the
        workers."""
        assert self._steps is not None
        steps, self._steps = self._steps, None
        return steps.then(second, argument, mine)

    def close(self) -> None:
        if self._steps is not None:
            steps, self._steps = self._steps, None
            steps.close()

    def __enter__(self) -> StatWalk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parallel_walk_digest(root: Path, processes: int, ctime: bool = True) -> StatWalk:
    """:func:`~ocistage.stagers.filemanifest.walk_digest` of ``root`` and its records, the subtrees
    walked by ``processes`` forked workers, which keep them (:class:`StatWalk`); the same
    digest and records in the same order. A small tree (or ``processes`` <= 1) is walked
    here. ``ctime``: as :func:`~ocistage.stagers.filemanifest.children`'s."""
    if processes <= 1:
        return _sequential(root, ctime)
    try:
        pieces = _expand(os.fspath(root), processes * SUBTREES_PER_PROCESS, ctime)
    except OSError as exc:
        raise unreadable(root, exc) from exc
    subtrees = [piece for piece in pieces if isinstance(piece, _Subtree)]
    if not MIN_PARALLEL_DIRS <= len(subtrees) <= MAX_QUEUE:  # small, or wider than a queue
        return _sequential(root, ctime)
    try:
        steps = queue_in_two_steps(_walk_subtree, subtrees, processes)
    except OSError as exc:
        raise unreadable(root, exc) from exc
    hasher = xxhash.xxh3_128()
    walked: list[list[Record] | int] = []
    number = 0
    for piece in pieces:
        if isinstance(piece, _Subtree):
            hasher.update(steps.results[number])
            walked.append(number)
            number += 1
        else:
            hasher.update(digest_lines(piece))
            walked.append(piece)
    steps.results.clear()  # the digest lines: not needed any more
    return StatWalk(hasher.hexdigest(), walked, steps,
                    tuple(subtree.prefix for subtree in subtrees))


def _sequential(root: Path, ctime: bool) -> StatWalk:
    records: list[Record] = []
    digest = walk_digest(root, records, ctime)
    return StatWalk(digest, [records])


def _expand(root: str, wanted: int, ctime: bool = True) -> list[_Piece]:
    """The walk of ``root`` as pieces: records listed here and subtrees left to walk, in the
    walk's order; the top levels are listed until there are ``wanted`` subtrees (at most
    :data:`MAX_EXPAND_DEPTH` levels, and a level that would make more tasks than a queue
    holds is not taken)."""
    pieces: list[_Piece] = [_Subtree(root, "", ctime)]
    for _level in range(MAX_EXPAND_DEPTH):
        expanded: list[_Piece] = []
        for piece in pieces:
            if not isinstance(piece, _Subtree):
                expanded.append(piece)
                continue
            rows, subdirs = children(piece.path, piece.prefix, ctime)
            expanded.append(rows)
            expanded.extend(_Subtree(path, prefix, ctime)
                            for path, prefix in reversed(subdirs))
        count = sum(1 for piece in expanded if isinstance(piece, _Subtree))
        if count > MAX_QUEUE:  # more tasks than a queue holds: the previous level's
            break
        pieces = expanded
        if count >= wanted or count == 0:
            break
    return pieces


def _walk_subtree(subtree: _Subtree) -> tuple[bytes, list[Record]]:
    """In a worker: the digest lines of the walk of ``subtree`` and its records (kept by
    the worker), in walk order."""
    rows = list(walk(subtree.path, subtree.prefix, subtree.ctime))
    return digest_lines(rows), rows


def _dumped(_argument: None, subtrees: dict[int, list[Record]],
            _claim: Callable[[int], bool]) -> dict[int, bytes]:
    """In a worker: the records of its subtrees as ``marshal`` blobs (dumped in 8 ms for 50k
    records, where pickling the list took 23 ms)."""
    return {number: marshal.dumps(rows) for number, rows in subtrees.items()}
