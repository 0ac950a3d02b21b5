"""The content-addressed store: an OCI image layout plus ocistage's own bookkeeping.

Layout (``CACHE`` is ``--cache``, ``$OCISTAGE_CACHE`` or ``$XDG_CACHE_HOME/ocistage``)::

    oci-layout                 {"imageLayoutVersion": "1.0.0"}
    index.json                 OCI index: one descriptor per pulled (reference, platform)
    blobs/sha256/<hex>         verified blobs, read-only, never rewritten
    ingest/<hex>.partial       a download in progress, kept after a crash for Range resume
    ingest/<hex>.lock          the owner of that download (see ocistage.cache.locks)
    tmp/<owner>-<random>/      scratch of a running process; removed when its owner is dead
    bundles/<key>/             cached bundles (ocistage.bundler.flows.bundle);
    .<key>.ocistage-<host>-<pid>-<r>
                               is one being built (:func:`ocistage.cache.builddirs.scratch_name`)
    used/, leases/             last use (ocistage.cache.usage) and leases (ocistage.cache.leases)
    quarantine/                corrupt entries moved aside (:func:`quarantine`)

Invariants: a path under ``blobs/`` exists only once its full content was verified against its
digest and fsync-ed; ``index.json`` is replaced by ``rename()`` under a lock. A crash at any
moment leaves at worst a partial file or a temp dir that :meth:`Store.open` or the next ingest of
the same blob cleans up or resumes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ocistage.cache import reserve
from ocistage.cache.atomicwrite import dead_writer_temp, write_file_atomic
from ocistage.cache.digest import Digest
from ocistage.cache.dirtrust import check_trusted_dir, owned_by_caller
from ocistage.cache.errors import TAMPERED_HINT, ForeignFile, StoreError, translate_oserror
from ocistage.cache.evict import evicted_in, may_remove, owner_of, remove_evicted, remove_in_cache
from ocistage.cache.fdio import process_umask
from ocistage.cache.jsondoc import parse_json, read_document
from ocistage.cache.locks import FileLock, Owner, owner_is_dead
from ocistage.cache.nodes import host_name
from ocistage.cache.notice import Kind, Notice
from ocistage.cache.owneddirs import OWNER_SUFFIX, drop_owned_dir, make_owned_dir, release_owned_dir
from ocistage.cache.privatedirs import PRIVATE_DIR_MODE
from ocistage.cache.readback import open_own
from ocistage.cache.refnames import INDEX_MEDIA_TYPE, record, record_name, renamed, untagged
from ocistage.errors import IntegrityError

if TYPE_CHECKING:
    from ocistage.cache.ingest import Ingest

OCI_LAYOUT_VERSION = "1.0.0"
INDEX_LIMIT = 16 << 20  # the cache's own index.json: ~40 000 refs (source layouts: 4 MiB)
QUARANTINE = "quarantine"
BUNDLES = "bundles"
SNAPSHOTS = "snapshots"


def quarantine(store: Store, path: Path, label: str) -> Path:
    """Move ``path`` into ``CACHE/quarantine`` (one rename); returns where it went.
    ``cache gc`` deletes quarantined entries after a week, or earlier when the cache is over
    its budget. ``quarantine/`` is made as a snapshot's directory is (:meth:`Store.tree_dir_mode`
    without any access for others): what is set aside holds an image's files."""
    directory = store.root / QUARANTINE
    destination = directory / f"{label}-{time.strftime('%Y%m%dT%H%M%S')}-{os.urandom(3).hex()}"
    try:
        made = False
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
            made = True
        st = os.lstat(directory)
        if owned_by_caller(st) and (made or st.st_mode & 0o007):  # others' bits: an older one
            os.chmod(directory, store.tree_dir_mode() & ~0o007)
        os.rename(path, destination)
    except OSError as exc:
        raise StoreError(f"cannot quarantine {path}: {exc.strerror}") from exc
    return destination



class Store:
    """A content-addressed store rooted at ``root`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        #: what opening the cache did that its user should know (the CLI prints them)
        self.notices: tuple[Notice, ...] = ()
        self.blobs = root / "blobs"
        self.ingest_dir = root / "ingest"
        self.tmp_dir = root / "tmp"

    @classmethod
    def open(cls, root: Path | str) -> Store:
        store = cls(Path(os.path.expanduser(root)).absolute())
        store._initialise()
        return store

    def _initialise(self) -> None:
        try:
            # the root is checked before anything is made in it, and each directory before
            # its child: nothing is created in a cache another user controls
            self._make_root()
            check_trusted_dir(self.root, "cache", group_shared=True, follow=True)
            for directory in (self.blobs, self.blobs / "sha256", self.ingest_dir, self.tmp_dir):
                directory.mkdir(exist_ok=True)
                check_trusted_dir(directory, "cache directory", group_shared=True)
            layout = self.root / "oci-layout"
            if not layout.exists():
                write_file_atomic(layout, json.dumps(
                    {"imageLayoutVersion": OCI_LAYOUT_VERSION}).encode())
            index = self.root / "index.json"
            if not index.exists():
                with FileLock(self.root / "index.json.lock"):
                    if not index.exists():
                        write_file_atomic(index, self._render_index([]))
            reserve.ensure(self.root)  # room for GC on a filesystem pulls will fill
        except OSError as exc:
            raise translate_oserror(exc, f"creating the cache at {self.root}") from exc
        self.clean_leftovers()

    def _make_root(self) -> None:
        """The cache's own directory, private to a user (issue 34): images from a private
        registry must not be readable by the other users of the host. A user's new cache is
        made owner-only (0700); a user's existing one that others may enter is tightened to
        it, with one warning (the next open finds nothing to do). A group-shared cache (setgid,
        docs/trust.md) and root's (the site's stores) keep the mode their maker gave them."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        euid = os.geteuid()
        try:
            os.mkdir(self.root, PRIVATE_DIR_MODE if euid != 0 else 0o777)
            return
        except FileExistsError:
            pass
        st = os.stat(self.root)
        loose = stat.S_IMODE(st.st_mode) & 0o077
        if (euid == 0 or st.st_uid != euid or not stat.S_ISDIR(st.st_mode)
                or st.st_mode & stat.S_ISGID or not loose):
            return
        tightened = stat.S_IMODE(st.st_mode) & ~0o077
        os.chmod(self.root, tightened)
        self.notices += (Notice(Kind.OTHER, (
            f"made the cache {self.root} private (mode {tightened:o}, was "
            f"{stat.S_IMODE(st.st_mode):o}): other users of this host could read the images in "
            "it; a cache shared on purpose is a group-shared one (setgid, docs/trust.md)")),)

    # -- blobs -------------------------------------------------------------------------------

    def blob_path(self, digest: Digest) -> Path:
        return self.blobs / digest.algorithm / digest.hex

    def has_blob(self, digest: Digest) -> bool:
        """Whether the blob is here as a regular file (a symlink at its name is not it)."""
        try:
            return stat.S_ISREG(os.lstat(self.blob_path(digest)).st_mode)
        except OSError:
            return False

    def open_blob(self, digest: Digest) -> BinaryIO:
        """The blob's file, opened without following a symbolic link at its name."""
        path = self.blob_path(digest)
        try:
            fd, _ = open_own(path, owners="anyone")  # never waits on a FIFO planted there
        except ForeignFile as exc:
            raise IntegrityError(f"blob {digest} in the cache is not a regular file",
                                 TAMPERED_HINT) from exc
        except FileNotFoundError as exc:
            raise StoreError(f"blob {digest} is not in the cache",
                             "pull the image again (`ocistage pull REF`)") from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise IntegrityError(f"blob {digest} in the cache is a symbolic link",
                                     TAMPERED_HINT) from exc
            raise translate_oserror(exc, f"opening blob {digest.short}") from exc
        return os.fdopen(fd, "rb")

    def read_blob(self, digest: Digest, limit: int = 4 << 20) -> bytes:
        """A small blob (manifest, config, index) read whole, capped at ``limit`` bytes and
        verified against its digest on every read: in a cache others can write, a stored
        document may have been replaced since it was verified."""
        with self.open_blob(digest) as blob:
            data = blob.read(limit + 1)
        if len(data) > limit:
            raise StoreError(f"blob {digest} is larger than {limit} bytes")
        if Digest.of_bytes(data, digest.algorithm) != digest:
            raise IntegrityError(f"blob {digest} in the cache does not match its digest "
                                 f"(changed since it was stored)", TAMPERED_HINT)
        return data

    def put_blob(self, data: bytes, digest: Digest | None = None) -> Digest:
        """Store a small blob already in memory; verified against ``digest`` when given."""
        actual = Digest.of_bytes(data, digest.algorithm if digest else "sha256")
        if digest is not None and actual != digest:
            raise IntegrityError(f"content has digest {actual}, expected {digest}")
        final = self.blob_path(actual)
        if final.exists():
            return actual
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            write_file_atomic(final, data, mode=0o444)
        except OSError as exc:
            raise translate_oserror(exc, f"writing blob {actual.short}") from exc
        return actual

    @contextlib.contextmanager
    def ingest(self, digest: Digest, size: int | None = None,
               wait: Callable[[], None] | None = None) -> Iterator[Ingest | None]:
        """Write blob ``digest`` into the store, or yield ``None`` if it is already there.

        If another process (on any node sharing the cache) is downloading the same blob, wait for
        it to finish instead of downloading twice; take over if that process dies. ``wait`` is
        called between polls (for progress display); it defaults to sleeping 0.2 s.
        """
        final = self.blob_path(digest)
        final.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.ingest_dir / f"{digest.hex}.lock")
        while True:
            if final.exists():
                yield None
                return
            if lock.try_acquire():
                break
            (wait or (lambda: time.sleep(0.2)))()
        try:
            if final.exists():  # published between our check and taking the lock
                yield None
                return
            from ocistage.cache.ingest import open_ingest  # a download: not every command

            ingest = open_ingest(self.ingest_dir, digest, size, final)
            try:
                yield ingest
            finally:
                ingest.close()
        finally:
            lock.release()

    # -- index.json (refs) -------------------------------------------------------------------

    def _render_index(self, manifests: list[dict[str, Any]]) -> bytes:
        return json.dumps({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE,
                           "manifests": manifests}, indent=2).encode() + b"\n"

    def read_index(self) -> list[dict[str, Any]]:
        try:
            data = parse_json(read_document(self.root / "index.json", INDEX_LIMIT, owners="group"))
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read {self.root / 'index.json'}: {exc}") from exc
        manifests = data.get("manifests", [])
        return [m for m in manifests if isinstance(m, dict)]

    def tag(self, name: str, descriptor: dict[str, Any]) -> None:
        """Record ``descriptor`` as ref ``name`` for the descriptor's platform in
        index.json
        (replacing the record of that platform); see :mod:`ocistage.cache.refnames` for the
        names."""
        platform = descriptor.get("platform")
        with FileLock(self.root / "index.json.lock"):
            manifests = [m for m in self.read_index()
                         if not (record_name(m) == name and m.get("platform") == platform)]
            manifests.append(record(name, descriptor))
            self._write_index(*renamed(manifests, {name}))

    def untag(self, match: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Remove the index.json records for which ``match`` is true; returns them."""
        with FileLock(self.root / "index.json.lock"):
            manifests, removed, documents = untagged(self.read_index(), match)
            if removed:
                self._write_index(manifests, documents)
        return removed

    def preview_untag(self, match: Callable[[dict[str, Any]], bool]) -> tuple[int, list[bytes]]:
        """What ``untag(match)`` would write: the size of index.json, and the index documents
        of the aliases it would name (stored as blobs unless they are there)."""
        manifests, _removed, documents = untagged(self.read_index(), match)
        return len(self._render_index(manifests)), documents

    def _write_index(self, manifests: list[dict[str, Any]], documents: list[bytes]) -> None:
        """Publish ``manifests`` (named as :mod:`ocistage.cache.refnames` names them); the
        index ``documents`` their aliases name are stored first, so the layout never names a
        missing blob."""
        for document in documents:
            self.put_blob(document)
        try:
            write_file_atomic(self.root / "index.json", self._render_index(manifests))
        except OSError as exc:
            raise translate_oserror(exc, "updating index.json") from exc

    def lookup(self, name: str) -> list[dict[str, Any]]:
        """The records of ref ``name``: one per cached platform."""
        return [m for m in self.read_index() if record_name(m) == name]

    # -- scratch space -------------------------------------------------------------------------

    @property
    def group_shared(self) -> bool:
        """Whether the cache is group-shared (docs/trust.md): its directory is setgid. Its
        snapshots and bundles are then open to the group, without the image's setuid/setgid
        bits and file capabilities (:mod:`ocistage.cache.privileges`); a private cache keeps
        them in owner-only directories instead."""
        try:
            return bool(os.stat(self.root).st_mode & stat.S_ISGID)
        except OSError:
            return False

    def tree_dir_mode(self) -> int:
        """The mode of a directory of the cache that holds an image's rootfs (a snapshot, a
        cached bundle): owner-only (:data:`PRIVATE_DIR_MODE`), or in a group-shared cache
        setgid and what the umask lets the group have, as every directory there."""
        if not self.group_shared:
            return PRIVATE_DIR_MODE
        umask = process_umask()
        return stat.S_ISGID | 0o777 & ~(0o022 if umask is None else umask)

    def temp_dir(self, prefix: str = "work") -> Path:
        """A fresh scratch dir owned by this process, owner-only; the caller removes or
        renames it."""
        owner = Owner.me()
        path = self.tmp_dir / f"{prefix}-{owner.host}-{owner.pid}-{uuid.uuid4().hex[:12]}"
        try:
            make_owned_dir(path, PRIVATE_DIR_MODE)
        except OSError as exc:
            raise translate_oserror(exc, "creating a temporary directory in the cache") from exc
        return path

    def remove_temp_dir(self, path: Path) -> None:
        drop_owned_dir(path)

    def evicted_homes(self) -> tuple[Path, ...]:
        """The directories where trees are evicted (:mod:`ocistage.cache.evict`)."""
        return (self.root / BUNDLES, self.root / SNAPSHOTS, self.root / QUARANTINE,
                self.tmp_dir)

    def _dead_scratch_removable(self, work: Path, marker: Path) -> bool:
        """Whether the scratch dir ``work`` (owner file ``marker``) is a dead process's that
        the caller may remove: its own, or anybody's for root. Another member's stays for
        them (their next command) or root: emptying it would fail halfway on their tree."""
        try:
            owner = os.lstat(work).st_uid
        except FileNotFoundError:
            owner = os.geteuid()  # only the owner file is left
        return may_remove(owner) and owner_is_dead(marker)

    def clean_leftovers(self, dry_run: bool = False) -> list[Path]:
        """Remove scratch dirs and partial downloads of dead owners, and the caller's trees
        that were evicted (:mod:`ocistage.cache.evict`: by another member's gc, or a removal
        that stopped); return what was removed (with ``dry_run``, what would be, removing
        nothing). What the caller may not remove (another member's, in a group-shared cache)
        is left for its owner or root, and never fails the command."""
        removed: list[Path] = []
        with contextlib.suppress(FileNotFoundError):
            for marker in _entries(self.tmp_dir, lambda name: name.endswith(OWNER_SUFFIX)):
                work = marker.with_suffix("")
                if self._dead_scratch_removable(work, marker):
                    if not dry_run:
                        try:
                            remove_in_cache(work)
                        except (OSError, StoreError):
                            continue  # holds what the caller cannot remove: left, see gc
                        release_owned_dir(work)
                    removed.append(work)
        for directory in self.evicted_homes():
            for tree in evicted_in(directory):
                owner = owner_of(tree)
                if owner is None or not may_remove(owner):
                    continue  # another member's: their next command removes it
                if dry_run or remove_evicted(tree) is None:
                    removed.append(tree)
        for directory in (self.root, self.root / "leases", self.blobs / "sha256"):
            with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name.startswith(".") and dead_writer_temp(entry.name):
                        if not dry_run:
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(entry.path)
                        removed.append(Path(entry.path))
        with contextlib.suppress(FileNotFoundError):
            for stale in _entries(self.ingest_dir, lambda name: ".lock.stale-" in name):
                if dry_run:
                    removed.append(stale)
                    continue
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
                    removed.append(stale)
            for path in _entries(self.ingest_dir, lambda name: name.endswith(".lock")):
                # a dead owner's lock on a blob nobody fetches again would stay forever:
                # break it (taking it over) and drop it
                if not owner_is_dead(path):
                    continue
                if dry_run:
                    removed.append(path)
                    continue
                lock = FileLock(path)
                if lock.try_acquire():
                    lock.release()
                    removed.append(path)
        return removed


def _entries(directory: Path, wanted: Callable[[str], bool]) -> list[Path]:
    """The entries of ``directory`` whose names are ``wanted`` (FileNotFoundError if it is
    gone; none if it cannot be read, as ``Path.glob`` skips it): what ``Path.glob("*SUFFIX")``
    finds, without compiling a pattern on every command (:meth:`Store.open` sweeps on every
    one)."""
    try:
        with os.scandir(directory) as entries:
            return [Path(entry.path) for entry in entries if wanted(entry.name)]
    except PermissionError:
        return []


def hostname() -> str:
    return host_name()
