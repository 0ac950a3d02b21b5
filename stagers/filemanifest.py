"""The file manifest of a tree: what was staged, and how to tell cheaply whether it changed.

A manifest lists every entry of a source tree (relative path, type, mode, size, mtime_ns, device
and inode of the *source* file, the xxh3-128 hash of a regular file's content, a symlink's
target, ctime_ns, and a digest of a regular file's extended attributes,
:mod:`ocistage.stagers.xattrs`). Like git's index, the stat fields decide whether a file may
have changed: an entry whose ``(type, mode, size, mtime_ns, dev, ino)`` equals the previous
manifest's keeps its hash and is not read again; only changed or new files are hashed. Its
xattr digest is kept while its ctime is unchanged too (an xattr change moves only the ctime).
A manifest written before the last two fields existed reads them as unknown: each file counts
as changed once.

It is written in a compact format (:meth:`Manifest.chunks`: NUL-ended fields after a header
line, version 2); the JSON document earlier versions wrote (:meth:`Manifest.json_chunks`,
version 1) is still read. An ocistage older than version 2 reads the compact one as no
manifest: it stages the tree anew once.

Scanning never follows symlinks and never leaves the tree: it walks with ``os.scandir`` and
``lstat`` semantics from the root given.
"""

from __future__ import annotations

import json
import operator
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import starmap
from pathlib import Path
from typing import Any, Literal, NamedTuple

import xxhash

from ocistage.cache.dirfds import DIR_FOLLOW, DIR_READ
from ocistage.cache.errors import ForeignFile
from ocistage.cache.readback import open_own
from ocistage.cache.targetlayout import MANIFEST_NAME as MANIFEST_NAME
from ocistage.cache.targetlayout import MARKER_NAME as MARKER_NAME
from ocistage.stagers import xattrs
from ocistage.stagers.errors import StageError
from ocistage.stagers.parallel import map_batched

#: files ocistage itself writes at the top of a staged bundle; never taken from a source
RESERVED_NAMES = frozenset({MANIFEST_NAME, MARKER_NAME})
MANIFEST_VERSION = 1  # the JSON manifest (Manifest.json_chunks), still read
#: the first line of a manifest in the compact format (Manifest.chunks)
MANIFEST_MAGIC = b"ocistage-manifest 2\n"
CHUNK = 1 << 20

EntryType = Literal["dir", "file", "symlink", "fifo", "other"]
_KINDS = frozenset({"dir", "file", "symlink", "fifo", "other"})


class Entry(NamedTuple):
    """One entry of a tree (a named tuple: a scan makes one per file, and a tuple is built
    three times faster than a frozen dataclass)."""

    path: str            # relative, "/"-separated, never "" (the root itself is not listed)
    type: EntryType
    mode: int            # permission bits (S_IMODE)
    size: int
    mtime_ns: int
    dev: int
    ino: int
    hash: str | None = None   # xxh3-128 hex of a regular file's content
    target: str | None = None  # a symlink's target, verbatim
    ctime_ns: int = 0    # moves with any inode change: an xattr's too
    #: a regular file's :func:`ocistage.stagers.xattrs.digest` ("" without xattrs); None:
    #: not known (hardlink staging keeps the inode, a manifest older than the field)
    xattrs: str | None = None

    def same_stat(self, other: Entry) -> bool:
        return (self.type, self.mode, self.size, self.mtime_ns, self.dev, self.ino) == (
            other.type, other.mode, other.size, other.mtime_ns, other.dev, other.ino)

    def same_content(self, other: Entry) -> bool:
        """Whether both describe identical staged results (content, mode, link target,
        xattrs; unknown xattrs are never the same)."""
        return (self.type, self.mode, self.hash, self.target, self.xattrs) == (
            other.type, other.mode, other.hash, other.target, other.xattrs) and (
            self.type != "file" or self.xattrs is not None)

    def with_hash(self, content_hash: str | None) -> Entry:
        """This entry with ``hash`` set (faster than ``dataclasses.replace``)."""
        return Entry(self.path, self.type, self.mode, self.size, self.mtime_ns, self.dev,
                     self.ino, content_hash, self.target, self.ctime_ns, self.xattrs)

    @classmethod
    def from_row(cls, row: list[Any]) -> Entry:
        """An entry of a manifest; one written before ``ctime_ns`` and ``xattrs`` were
        (nine fields) has them unknown: 0 and None."""
        if len(row) == 9:
            row = [*row, 0, None]
        path, kind, mode, size, mtime_ns, dev, ino, digest, target, ctime_ns, xattrs = row
        return cls(str(path), kind, int(mode), int(size), int(mtime_ns), int(dev), int(ino),
                   None if digest is None else str(digest),
                   None if target is None else str(target), int(ctime_ns),
                   None if xattrs is None else str(xattrs))


@dataclass(frozen=True)
class Manifest:
    entries: tuple[Entry, ...]
    source: str = ""
    method: str = ""
    readonly_root: bool = False

    def by_path(self) -> dict[str, Entry]:
        return {entry.path: entry for entry in self.entries}

    def json_chunks(self, batch: int = 4096) -> Iterator[bytes]:
        """The manifest as the JSON document :meth:`from_json` reads, in pieces of at most
        ``batch`` entries each (the entries are tuples: JSON arrays, read by
        :meth:`Entry.from_row`). Written so, a manifest is never held whole: 300k entries make
        ~45 MB of JSON, held twice by one ``json.dumps`` (the text and its bytes)."""
        head = json.dumps({"version": MANIFEST_VERSION, "source": self.source,
                           "method": self.method, "readonlyRoot": self.readonly_root,
                           "entries": []}, separators=(",", ":"))
        yield head[:-2].encode()  # up to and with the entries' "["
        for start in range(0, len(self.entries), batch):
            rows = json.dumps(self.entries[start:start + batch], separators=(",", ":"))
            yield (rows[1:-1] if start == 0 else "," + rows[1:-1]).encode()
        yield b"]}"

    def chunks(self, batch: int = 4096) -> Iterator[bytes]:
        """The manifest in the compact format :meth:`from_bytes` reads (version 2), in
        pieces of at most ``batch`` entries each: the line :data:`MANIFEST_MAGIC`, a line of
        JSON (source, method, readonlyRoot, the number of entries), then the eleven fields
        of every entry, each ended by a NUL (no path, link target, hash or xattr digest
        holds one): integers in decimal, a missing hash or link target as "", unknown xattrs
        as "?"; text as UTF-8 (lone surrogates, as in names that are not UTF-8, passed
        through). A third of the time of :meth:`json_chunks` to write, read with one split
        and a conversion per column."""
        yield manifest_head(self.source, self.method, self.readonly_root, len(self.entries))
        entries = self.entries
        for start in range(0, len(entries), batch):
            yield manifest_body(entries[start:start + batch])

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """A manifest as :meth:`chunks` writes it, or as :meth:`json_chunks` did (version
        1, still read); ValueError if it is neither."""
        if not data.startswith(MANIFEST_MAGIC):
            return cls.from_json(data)
        head, newline, body = data[len(MANIFEST_MAGIC):].partition(b"\n")
        doc = json.loads(head)
        if not newline or not isinstance(doc, dict):
            raise ValueError("not a manifest")
        fields = body.decode("utf-8", "surrogatepass").split("\0")
        if fields.pop() != "" or len(fields) != 11 * doc["entries"]:
            raise ValueError("a manifest cut short, or with another number of fields")
        entries = entries_of_fields(fields)
        return cls(entries, source=str(doc.get("source", "")),
                   method=str(doc.get("method", "")),
                   readonly_root=bool(doc.get("readonlyRoot", False)))

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("version") != MANIFEST_VERSION:
            raise ValueError("unknown manifest version")
        return cls(tuple(Entry.from_row(row) for row in doc["entries"]),
                   source=str(doc.get("source", "")), method=str(doc.get("method", "")),
                   readonly_root=bool(doc.get("readonlyRoot", False)))


def manifest_head(source: str, method: str, readonly_root: bool, entries: int) -> bytes:
    """The first two lines of a manifest in the compact format (:meth:`Manifest.chunks`)."""
    head = json.dumps({"source": source, "method": method, "readonlyRoot": readonly_root,
                       "entries": entries}, separators=(",", ":"))
    return MANIFEST_MAGIC + head.encode() + b"\n"


def manifest_body(entries: Iterable[Entry]) -> bytes:
    """``entries`` in the compact format (:meth:`Manifest.chunks`): eleven NUL-ended fields
    each; pieces of a body can be joined."""
    return "".join([
        f"{path}\0{kind}\0{mode}\0{size}\0{mtime_ns}\0{dev}\0{ino}\0{digest or ''}"
        f"\0{target or ''}\0{ctime_ns}\0{'?' if xattr_digest is None else xattr_digest}\0"
        for path, kind, mode, size, mtime_ns, dev, ino, digest, target, ctime_ns,
        xattr_digest in entries]).encode("utf-8", "surrogatepass")


def entries_of_fields(fields: list[str]) -> tuple[Entry, ...]:
    """The entries of a compact manifest's body split at its NULs (without the empty string
    after the last): eleven fields each; ValueError for an entry of an unknown type."""
    kinds = fields[1::11]
    if not set(kinds) <= _KINDS:
        raise ValueError("an entry of an unknown type")
    modes, sizes, mtimes, devs, inodes, ctimes = (list(map(int, fields[n::11]))
                                                  for n in (2, 3, 4, 5, 6, 9))
    return tuple(starmap(Entry, zip(
        fields[0::11], kinds, modes, sizes, mtimes, devs, inodes,
        [digest or None for digest in fields[7::11]],
        [target or None for target in fields[8::11]], ctimes,
        [None if digest == "?" else digest for digest in fields[10::11]], strict=True)))


def load_manifest(path: Path) -> Manifest | None:
    """The manifest at ``path``; None when it is missing, unreadable or not a regular file of
    the caller or root (:mod:`ocistage.cache.readback`): treated as no manifest."""
    try:
        fd, _ = open_own(path)
        with os.fdopen(fd, "rb") as file:
            return Manifest.from_bytes(file.read())
    except (OSError, ValueError, KeyError, TypeError, ForeignFile):
        return None


_TYPES: dict[int, EntryType] = {stat.S_IFDIR: "dir", stat.S_IFREG: "file",
                                 stat.S_IFLNK: "symlink", stat.S_IFIFO: "fifo"}


def entry_type(mode: int) -> EntryType:
    return _TYPES.get(stat.S_IFMT(mode), "other")


#: what a walk yields per entry: relative path, type, mode bits, size, mtime_ns, st_dev,
#: st_ino, a symlink's target, ctime_ns (an :class:`Entry` without its hash and xattrs: flat,
#: so forked walkers hand records back cheaply, :mod:`ocistage.stagers.statwalk`)
Record = tuple[str, EntryType, int, int, int, int, int, str | None, int]


def scan(root: Path) -> list[Entry]:
    """Every entry under ``root`` (not following symlinks), parents before children.

    Top-level names in :data:`RESERVED_NAMES` are skipped: a staged bundle can be a source.
    """
    try:
        return entries_of(walk(root))
    except OSError as exc:
        raise unreadable(root, exc) from exc


def unreadable(root: Path | str, exc: OSError) -> StageError:
    """The error of a source tree that cannot be walked (an entry that cannot be listed or
    ``lstat``-ed, or that vanished meanwhile)."""
    return StageError(f"cannot read the source tree {root}: {exc.strerror} ({exc.filename})")


def entries_of(records: Iterable[Record], before: Mapping[str, Entry] | None = None,
               ) -> list[Entry]:
    """The entries of a walk's records (see :func:`walk_digest`). With ``before`` (the
    previous manifest by path), a file whose stat fields are unchanged keeps its hash, as in
    :func:`fill_hashes`, and its xattr digest if its ctime is unchanged too — in the same
    pass, so :func:`fill_missing_hashes` and :func:`fill_xattrs` only read what changed."""
    if not before:
        return [Entry(rel, kind, mode, size, mtime_ns, dev, ino, None, target, ctime_ns)
                for rel, kind, mode, size, mtime_ns, dev, ino, target, ctime_ns in records]
    result = []
    get = before.get
    for record in records:
        rel, kind, mode, size, mtime_ns, dev, ino, target, ctime_ns = record
        content_hash = xattrs = None
        if kind == "file":
            old = get(rel)
            if old is not None and old[1:7] == record[1:7]:  # Entry.same_stat
                content_hash = old.hash
                if old.ctime_ns == ctime_ns:  # no inode change: the same xattrs
                    xattrs = old.xattrs
        result.append(Entry(rel, kind, mode, size, mtime_ns, dev, ino, content_hash, target,
                            ctime_ns, xattrs))
    return result


_name = operator.attrgetter("name")


def listing(directory: str | int, prefix: str) -> list[os.DirEntry[str]]:
    """The entries of ``directory`` (a path, or a descriptor: then each entry's ``stat`` is
    relative to it; relative path ``prefix``, "" or ending in "/") in the order of a walk
    (by name), without the reserved names at the top (``prefix == ""``)."""
    with os.scandir(directory) as found:
        entries = sorted(found, key=_name)
    if not prefix:
        entries = [e for e in entries if e.name not in RESERVED_NAMES]
    return entries


def children(directory: str, prefix: str, ctime: bool = True,
             ) -> tuple[list[Record], list[tuple[str, str]]]:
    """One step of a walk: the records of the entries in ``directory`` (whose relative path
    is ``prefix``, "" or ending in "/"), sorted by name, and its subdirectories as
    (absolute path, relative prefix) in the same order. Reserved names are skipped at the
    top (``prefix == ""``). ``ctime`` False: records carry 0 as their ctime (hardlink
    staging, whose own links move the source's ctimes, and which reads no xattrs)."""
    records: list[Record] = []
    subdirs: list[tuple[str, str]] = []
    types = _TYPES  # entry_type() inline: the hot loop of every re-stage (~4% of its walk)
    # Listed through a descriptor of the directory, each entry's lstat is relative to it
    # (one name looked up, not the whole path: a fifth of the walk's time on a deep tree);
    # below the top, the directory is opened without following a symlink that replaced it.
    fd = os.open(directory, DIR_READ if prefix else DIR_FOLLOW)
    above = directory if directory.endswith("/") else f"{directory}/"
    try:
        for child in listing(fd, prefix):
            st = child.stat(follow_symlinks=False)
            mode = st.st_mode
            kind = types.get(stat.S_IFMT(mode), "other")
            name = child.name
            rel = prefix + name
            records.append((rel, kind, stat.S_IMODE(mode), st.st_size, st.st_mtime_ns,
                            st.st_dev, st.st_ino,
                            os.readlink(name, dir_fd=fd) if kind == "symlink" else None,
                            st.st_ctime_ns if ctime else 0))
            if kind == "dir":
                subdirs.append((above + name, rel + "/"))
    finally:
        os.close(fd)
    return records, subdirs


def walk(root: Path | str, prefix: str = "", ctime: bool = True) -> Iterator[Record]:
    """The :data:`Record` of every entry below ``root`` but the reserved names at its top,
    depth first in a fixed order, the order of the manifest: a directory's listing (by name),
    then the subtrees of its subdirectories, the last name first (:mod:`ocistage.stagers.fresh`
    produces the same order without this walk). ``prefix`` (ending in ``/``): ``root`` is
    that subdirectory of the tree, and relative paths start with it
    (:mod:`ocistage.stagers.statwalk`); ``ctime``: as :func:`children`'s."""
    stack: list[tuple[str, str]] = [(os.fspath(root), prefix)]
    while stack:
        directory, prefix = stack.pop()
        records, subdirs = children(directory, prefix, ctime)
        yield from records
        stack.extend(subdirs)


def _line(path: str, kind: str, mode: int, size: int, mtime_ns: int, dev: int, ino: int,
          target: str | None, ctime_ns: int) -> str:
    return (f"{path}\0{kind}\0{mode}\0{size}\0{mtime_ns}\0{dev}\0{ino}\0{target or ''}"
            f"\0{ctime_ns}\n")


def digest_line(path: str, kind: str, mode: int, size: int, mtime_ns: int, dev: int, ino: int,
                target: str | None, ctime_ns: int) -> bytes:
    """One entry's line of the stat digest (with the ctime: an xattr change moves only it)."""
    return _line(path, kind, mode, size, mtime_ns, dev, ino, target, ctime_ns).encode(
        "utf-8", "surrogateescape")


def digest_lines(records: Iterable[Record]) -> bytes:
    """The :func:`digest_line` of every record, concatenated (encoded once)."""
    return "".join([_line(*record) for record in records]).encode("utf-8", "surrogateescape")


def entries_digest(entries: Iterable[Entry]) -> str:
    """xxh3-128 over the stat fields of ``entries``; equals :func:`stat_digest` of the tree
    they were scanned from as long as nothing in it changed."""
    hasher = xxhash.xxh3_128()
    for e in entries:
        hasher.update(digest_line(e.path, e.type, e.mode, e.size, e.mtime_ns, e.dev, e.ino,
                                   e.target, e.ctime_ns))
    return hasher.hexdigest()


def stat_digest(root: Path) -> str:
    """The :func:`entries_digest` of ``scan(root)``, computed while walking (no entries are
    built): the cheap "did anything change?" check of a re-stage."""
    return walk_digest(root, None)


def walk_digest(root: Path, records: list[Record] | None, ctime: bool = True) -> str:
    """:func:`stat_digest` of ``root``, appending what the walk saw to ``records`` (unless
    None) on the way: when the digest says the tree changed, :func:`entries_of` turns them
    into its entries without a second walk (one ``lstat`` per entry, not two)."""
    hasher = xxhash.xxh3_128()
    keep = records.append if records is not None else None
    try:
        for record in walk(root, ctime=ctime):
            hasher.update(digest_line(*record))
            if keep is not None:
                keep(record)
    except OSError as exc:
        raise unreadable(root, exc) from exc
    return hasher.hexdigest()


def hash_file(path: Path | str) -> str:
    """xxh3-128 hex digest of a file's content, read in chunks (never the whole file)."""
    hasher = xxhash.xxh3_128()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while chunk := os.read(fd, CHUNK):
            hasher.update(chunk)
    finally:
        os.close(fd)
    return hasher.hexdigest()


def fill_hashes(root: Path, entries: Iterable[Entry], previous: Manifest | None,
                jobs: int = 8) -> tuple[list[Entry], int]:
    """Entries with hashes: reused from ``previous`` when the stat matches, else computed.

    Returns the entries and how many files were hashed. Files are hashed in a thread pool
    (reads and xxh3 release the GIL), in batches of about equal bytes.
    """
    return fill_hashes_by_path(root, entries, previous.by_path() if previous else {}, jobs)


def fill_hashes_by_path(root: Path, entries: Iterable[Entry], old: Mapping[str, Entry],
                        jobs: int = 8) -> tuple[list[Entry], int]:
    """:func:`fill_hashes` with the previous manifest given as ``Manifest.by_path()``."""
    result = list(entries)
    for n, entry in enumerate(result):
        if entry.type != "file":
            continue
        before = old.get(entry.path)
        if before is not None and before.hash is not None and before.same_stat(entry):
            result[n] = entry.with_hash(before.hash)
    return fill_missing_hashes(root, result, jobs)


def fill_missing_hashes(root: Path, entries: list[Entry], jobs: int = 8,
                        ) -> tuple[list[Entry], int]:
    """``entries`` with the content hash of every file that has none yet (read in batches
    of about equal bytes on a thread pool: reads and xxh3 release the GIL); returns them and
    how many files were read."""
    result = list(entries)
    todo = [n for n, e in enumerate(result) if e.type == "file" and e.hash is None]
    base = os.fspath(root)

    def work(n: int) -> str:
        return hash_file(os.path.join(base, result[n].path))

    try:
        hashes = map_batched(work, todo, jobs, weight=lambda n: result[n].size)
        for n, digest in zip(todo, hashes, strict=True):
            result[n] = result[n].with_hash(digest)
    except OSError as exc:
        raise StageError(f"cannot read {exc.filename}: {exc.strerror}",
                         "the source files must be readable by you") from exc
    return result, len(todo)


def fill_xattrs(root: Path, entries: list[Entry]) -> list[Entry]:
    """``entries`` with the xattr digest of every file that has none yet (new, or its ctime
    moved: :func:`entries_of`); one ``listxattr`` each."""
    base = os.fspath(root)
    try:
        return [entry._replace(xattrs=xattrs.digest(f"{base}/{entry.path}"))
                if entry.type == "file" and entry.xattrs is None else entry
                for entry in entries]
    except OSError as exc:
        raise StageError(f"cannot read the xattrs of {exc.filename}: {exc.strerror}",
                         "the source files must be readable by you") from exc


def unchanged(current: list[Entry], previous: Manifest) -> bool:
    """Whether a scan (without hashes) matches ``previous`` entry for entry, by stat."""
    if len(current) != len(previous.entries):
        return False
    return all(a.path == b.path and a.same_stat(b) and a.target == b.target
               for a, b in zip(current, previous.entries, strict=True))
