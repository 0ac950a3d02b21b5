"""Parts of the previous version's compact manifest, read without parsing all of it.

A re-stage's workers (:mod:`ocistage.stagers.restage`) each need the previous entries of the
subtrees they walked, and the stager those of the directories it listed itself. In the walk
order (:func:`ocistage.stagers.filemanifest.walk`) a directory's listing comes first and its
subtrees follow it, so in a manifest the entries of one subtree (the paths that start with its
relative path and ``/``) are one run, and a directory's listing is the start of its run. A
part is found by searching the raw bytes for a NUL followed by that prefix (a path field: the
field after it is a type; a symlink's target that starts so is followed by a ctime), and only
its run is decoded and split into its fields.
Parts are asked for in walk order: each search starts where the last part started.

What is not found (a new directory, an older manifest's other order) is no part: its files
count as new (hashed, then linked from the pool or copied), as with no manifest at all.
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache.errors import ForeignFile
from ocistage.cache.readback import open_own
from ocistage.stagers.filemanifest import MANIFEST_MAGIC

#: the type field of an entry, as a manifest spells it
_KIND_FIELDS = frozenset({b"dir", b"file", b"symlink", b"fifo", b"other"})


@dataclass(frozen=True)
class Seen:
    """The manifest file the stager read (path and ``fstat`` identity): a worker reading it
    again uses it only if it is that very file, unchanged."""

    path: Path
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path, st: os.stat_result) -> Seen:
        return cls(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class PreviousParts:
    """A compact manifest's bytes, handing out the entries of its parts (module docstring)."""

    def __init__(self, data: bytes) -> None:
        """``data``: a manifest in the compact format; ValueError for anything else."""
        newline = data.find(b"\n", len(MANIFEST_MAGIC))
        head = _head(data[:len(MANIFEST_MAGIC)], data[len(MANIFEST_MAGIC):newline + 1])
        if newline < 0 or head is None:
            raise ValueError("not a compact manifest")
        self.method, entries = head
        self._data = data
        self._body = self._at = newline + 1
        self._per_entry = (len(data) - self._body) / max(1, entries)

    @classmethod
    def read(cls, path: Path, seen: Seen | None = None) -> tuple[PreviousParts, Seen] | None:
        """The manifest at ``path`` (a file of the caller or root), and what it is; None if it
        is missing, not in the compact format, or not the file ``seen``."""
        try:
            fd, st = open_own(path)
            with os.fdopen(fd, "rb") as file:
                found = Seen.of(path, st)
                if seen is not None and found != seen:
                    return None
                return cls(file.read()), found
        except (OSError, ValueError, ForeignFile):
            return None

    @staticmethod
    def head(path: Path) -> tuple[str, Seen] | None:
        """The method of the compact manifest at ``path`` (a file of the caller or root) and
        what it is, from its head alone (the magic line and the JSON line after it;
        :meth:`read` then reads it whole only where it is needed); None if it is missing or
        not a compact manifest."""
        try:
            fd, st = open_own(path)
            with os.fdopen(fd, "rb") as file:
                magic = file.read(len(MANIFEST_MAGIC))
                line = file.readline(1 << 16)
        except (OSError, ForeignFile):
            return None
        head = _head(magic, line)
        return None if head is None else (head[0], Seen.of(path, st))

    def rewind(self) -> None:
        """Search the next part from the start (parts asked for in walk order again)."""
        self._at = self._body

    def part(self, prefix: str, subtree: bool, expected: int) -> list[str]:
        """The fields (eleven per entry, as a compact manifest has them) of the previous
        entries below ``prefix`` ("" or a relative path ending in "/"): its whole subtree,
        or (``subtree`` False) the directory's listing alone. ``expected``: about how many
        (what the walk found now), to decode little more than the part."""
        start = self._start_of(prefix)
        if start < 0:
            return []
        data = self._data
        size = int(self._per_entry * (expected + 16) * 1.25) + 4096
        while True:
            end = len(data) if start + size >= len(data) else data.rfind(b"\0", start,
                                                                        start + size) + 1
            fields = data[start:end].decode("utf-8", "surrogatepass").split("\0")
            fields.pop()  # after the last NUL: "" or the start of a field cut off
            count = len(fields) // 11
            paths = fields[0:count * 11:11]
            cut = _run_length(paths, prefix, subtree)
            if cut < count or end == len(data):
                break
            size *= 4
        self._at = start
        del fields[cut * 11:]
        return fields

    def _start_of(self, prefix: str) -> int:
        """Where the first path starting with ``prefix`` starts; -1 if none does."""
        if not prefix:
            return self._body
        data = self._data
        needle = b"\0" + prefix.encode("utf-8", "surrogatepass")
        for origin in dict.fromkeys((self._at, self._body)):
            pos = data.find(needle, origin - 1)
            while pos >= 0 and not self._is_path(pos + 1):
                pos = data.find(needle, pos + 1)
            if pos >= 0 and not data.startswith(needle[1:], self._entry_before(pos + 1)):
                return pos + 1  # (else: inside the run, found after an earlier part)
        return -1

    def _is_path(self, at: int) -> bool:
        """Whether the field starting at ``at`` is an entry's path (followed by its type)."""
        data = self._data
        end = data.find(b"\0", at)
        if end < 0:
            return False
        kind_end = data.find(b"\0", end + 1)
        return data[end + 1:kind_end] in _KIND_FIELDS

    def _entry_before(self, start: int) -> int:
        """Where the entry before the one starting at ``start`` starts (``start`` itself for
        the first entry)."""
        if start <= self._body:
            return start
        at = start - 1  # the NUL that ends the entry before
        for _ in range(11):
            at = self._data.rfind(b"\0", self._body, at)
            if at < 0:
                break
        return max(at + 1, self._body)


def _run_length(paths: list[str], prefix: str, subtree: bool) -> int:
    """How many of ``paths`` (starting with the part's first) belong to the part."""
    if subtree:  # the run is contiguous: the paths that start with the prefix come first
        return bisect.bisect_left(range(len(paths)), True,
                                  key=lambda n: not paths[n].startswith(prefix))
    skip = len(prefix)
    for n, path in enumerate(paths):
        if not path.startswith(prefix) or "/" in path[skip:]:
            return n
    return len(paths)


def _head(magic: bytes, line: bytes) -> tuple[str, int] | None:
    """The method and entry count of a compact manifest whose first bytes are ``magic`` and
    whose JSON line after them is ``line`` (with its newline); None for anything else."""
    if magic != MANIFEST_MAGIC or not line.endswith(b"\n"):
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), int):
        return None
    return str(doc.get("method", "")), doc["entries"]
