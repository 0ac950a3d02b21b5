"""Building one version of a staged tree in its scratch directory.

Directories, symlinks and
fifos first, then every regular file by the staging method's placer
(:mod:`ocistage.stagers.placers`: hardlink from the source, via the target's pool, or an
independent copy; unchanged files of the previous version carried over), then the times and
modes of directories, children before parents.

:class:`Builder` holds the scratch tree, the placer and what placing did. Placing files runs in
threads or forked workers (:mod:`ocistage.stagers.parallel`); the counts are kept here, from
the outcomes the workers return.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache.cpus import usable_cpus
from ocistage.stagers.filemanifest import Entry, Manifest
from ocistage.stagers.parallel import map_batched, map_parts
from ocistage.stagers.placers import Outcome, Placer, placer_for
from ocistage.stagers.pool import Pool
from ocistage.stagers.target import Method

__all__ = ["FORK_MIN_FILES", "Builder", "Counts", "Outcome"]

#: below this many files, forking workers costs more than it saves (threads are used)
FORK_MIN_FILES = 2000


@dataclass
class Counts:
    copied: int = 0
    linked: int = 0
    unchanged: int = 0
    bytes_copied: int = 0


class Builder:
    def __init__(self, source: Path, scratch: Path, final: Path, method: Method,
                 previous: Manifest | None, pool: Pool, jobs: int,
                 old: dict[str, Entry] | None = None, *, carry_over: bool = True) -> None:
        """``old``: ``previous.by_path()`` if the caller has it; ``carry_over`` False: take
        nothing over from the previous version (a job may be writing to it)."""
        self.source = source
        self.scratch = scratch
        self._scratch_text = os.fspath(scratch)
        if old is None:
            old = previous.by_path() if previous is not None else {}
        self.jobs = jobs
        self.counts = Counts()
        self.hashes: dict[str, str] = {}  # computed while copying (first stage into a pool)
        self.replaced: list[Entry] = []  # files not staged unchanged (new or changed)
        #: whether files' xattr digests are read: not by hardlink, which stages the inode
        self.reads_xattrs = method != Method.HARDLINK
        carry_over = carry_over and previous is not None and previous.method == method
        self.placer: Placer = placer_for(method)(source, scratch, final, old, carry_over,
                                                 pool)

    def close(self) -> None:
        self.placer.close()

    def build(self, entries: list[Entry]) -> None:
        """Make ``entries`` (parents before children) in the scratch tree."""
        timed = self.make_nodes(entries)
        self.place_files([entry for entry in entries if entry.type == "file"])
        self.set_times(timed)

    def make_nodes(self, entries: Sequence[Entry]) -> list[Entry]:
        """Create the directories (private until :meth:`set_times`), symlinks and fifos among
        ``entries``; returns those whose times and modes are set last."""
        scratch = self._scratch_text
        timed: list[Entry] = []  # directories and symlinks: their mtimes are set last
        for entry in entries:
            if entry.type == "dir":
                os.mkdir(f"{scratch}/{entry.path}", 0o700)
                timed.append(entry)
            elif entry.type == "symlink":
                assert entry.target is not None
                os.symlink(entry.target, f"{scratch}/{entry.path}")
                timed.append(entry)
            elif entry.type == "fifo":
                os.mkfifo(f"{scratch}/{entry.path}", entry.mode)
        return timed

    def set_times(self, timed: Sequence[Entry]) -> None:
        """Give the entries :meth:`make_nodes` returned their mtimes, and directories their
        modes: children before parents (a directory's mtime changes when one is added)."""
        self.set_times_of(self._scratch_text, timed)

    @staticmethod
    def set_times_of(scratch: str, timed: Sequence[Entry]) -> None:
        """:meth:`set_times` in the scratch tree ``scratch``."""
        for entry in reversed(timed):
            dest = f"{scratch}/{entry.path}"
            os.utime(dest, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)
            if entry.type == "dir":
                os.chmod(dest, entry.mode)

    def place_files(self, files: list[Entry]) -> None:
        """Put the regular files ``files`` into the scratch tree (their directories exist),
        spread over threads or forked workers, and count what was done."""
        placer = self.placer
        singles, groups = placer.groups(files)
        # batches of equal work (Placer.weight)
        weight = placer.weight()
        processes = min(self.jobs, usable_cpus())
        if processes > 1 and len(singles) >= FORK_MIN_FILES:
            outcomes = map_parts(placer.place_part, singles, processes, weight=weight)
        elif placer.copies_some(singles):
            outcomes = map_batched(placer.place, singles, self.jobs, weight=weight)
        else:  # links only: threads would only contend for the GIL
            outcomes = placer.place_part(singles)
        self.count(singles, outcomes)
        scratch = self._scratch_text
        for entry, first in groups:
            os.link(os.path.join(scratch, first.path), os.path.join(scratch, entry.path))
            self.counts.linked += 1

    def count(self, files: Sequence[Entry], outcomes: Sequence[Outcome]) -> None:
        """Add what :meth:`Placer.place_part` did for ``files`` to the counts, the replaced files
        and the hashes computed on the way."""
        for entry, (outcome, size, content_hash) in zip(files, outcomes, strict=True):
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

    def with_hashes(self, entries: list[Entry]) -> list[Entry]:
        """``entries`` with the hashes computed while placing them (:attr:`hashes`)."""
        hashes = self.hashes
        if not hashes:
            return entries
        return [e if e.path not in hashes else e.with_hash(hashes[e.path]) for e in entries]
