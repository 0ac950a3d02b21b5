"""Unpack an image's layers while they download, into snapshots of the cache or a scratch rootfs.

The pipeline for one image (``docs/performance.md`` has the measurements behind it)::

    registry --HTTP--> pull thread(s): hash + write ingest/<hex>.partial   (one per layer)
                                         |  (BlobFollower: readers follow the growing file)
                       decompress thread: read, gunzip/unzstd, hash (diff_id) --queue-->
                       main thread: tar parse + write files (bundler.layers.apply_layer)

Layers are applied in order into one scratch rootfs; layer N+1 downloads while layer N is
being applied, and decompression runs beside tar parsing (zlib, zstd and hashlib release the
GIL). Nothing is published before the pull finished (every blob verified against its digest
at commit) and every layer's uncompressed stream matched its diff_id: the scratch tree is then
renamed into place (a snapshot, by :mod:`cache.snapshots`) or thrown away.

If a download has to start over (the server ignored ``Range``, or the blob failed
verification), the bytes already unpacked may not be the blob's: the build raises
:class:`StreamRestarted` and the caller starts again from the verified blobs.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from bundler.decompress import open_layer_stream
from bundler.layers import apply_layer
from bundler.manifest import Descriptor, ImageConfig
from bundler.registry_types import BlobSink
from cache.digest import Digest
from cache.errors import IntegrityError, OcistageError
from cache.store import Ingest, Store
from cache.unpackbudget import UnpackBudget

CHUNK = 1 << 20
QUEUE_CHUNKS = 8  # decompressed MiB in flight between the decompress and the tar thread


class StreamRestarted(OcistageError):
    """A layer's download started over while it was being unpacked (internal: retried)."""


class PullFailed(OcistageError):
    """The pull stopped before the config was known (internal: the pull's error is raised)."""


@dataclass
class _Blob:
    partial: Path | None = None
    generation: int = 0        # bumped when written bytes are discarded
    done: bool = False


@dataclass
class BlobFollower:
    """A :class:`bundler.pull.PullObserver` that lets readers follow blobs as they download."""

    store: Store
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _blobs: dict[Digest, _Blob] = field(default_factory=dict)
    _config: tuple[Digest, ImageConfig, tuple[Descriptor, ...]] | None = None
    _stopped: bool = False

    # -- the pull's side ---------------------------------------------------------------------

    def config_ready(self, manifest_digest: Digest, config: ImageConfig,
                     layers: tuple[Descriptor, ...]) -> None:
        with self._cond:
            self._config = (manifest_digest, config, layers)
            self._cond.notify_all()

    def sink(self, digest: Digest, ingest: Ingest) -> BlobSink:
        with self._cond:
            blob = self._blobs.setdefault(digest, _Blob())
            blob.partial = ingest.partial
            blob.done = False
            self._cond.notify_all()
        return _TeeSink(self, digest, ingest)

    def finished(self, digest: Digest, ok: bool) -> None:
        with self._cond:
            blob = self._blobs.setdefault(digest, _Blob())
            if ok:
                blob.done = True
            else:
                blob.generation += 1
                blob.partial = None
            self._cond.notify_all()

    def wrote(self, digest: Digest, restarted: bool = False) -> None:
        with self._cond:
            if restarted:
                self._blobs[digest].generation += 1
            self._cond.notify_all()

    def discarded(self) -> bool:
        """Whether any download started over (bytes a reader may have seen were dropped)."""
        with self._cond:
            return any(blob.generation for blob in self._blobs.values())

    def stop(self) -> None:
        """The pull ended (successfully or not): nothing more will arrive."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    # -- the reader's side -------------------------------------------------------------------

    def wait_config(self) -> tuple[Digest, ImageConfig, tuple[Descriptor, ...]]:
        with self._cond:
            while self._config is None:
                if self._stopped:
                    raise PullFailed("the pull ended before the image config was known")
                self._cond.wait()
            return self._config

    def open(self, digest: Digest) -> BinaryIO:
        """The blob's bytes: from the store once published, else following its download."""
        with self._cond:
            while True:
                blob = self._blobs.get(digest)
                if blob is not None and blob.done:
                    return self.store.open_blob(digest)
                if blob is not None and blob.partial is not None:
                    try:
                        file = open(blob.partial, "rb")  # noqa: SIM115 - owned by the reader
                    except FileNotFoundError:
                        if self.store.has_blob(digest):  # committed just now
                            return self.store.open_blob(digest)
                        self._cond.wait(timeout=0.1)
                        continue
                    return _FollowingReader(self, digest, blob.generation, file)  # type: ignore[return-value]
                if self._stopped:
                    raise StreamRestarted(f"blob {digest.short} was not downloaded")
                self._cond.wait()

    def check(self, digest: Digest, generation: int) -> None:
        """Raise if the bytes of ``digest`` were discarded since a reader started."""
        with self._cond:
            if self._blobs[digest].generation != generation:
                raise StreamRestarted(f"the download of {digest.short} started over")

    def wait_more(self, digest: Digest, generation: int) -> bool:
        """Block until more bytes may be there; ``False`` once the blob is complete."""
        with self._cond:
            blob = self._blobs[digest]
            if blob.generation != generation:
                raise StreamRestarted(f"the download of {digest.short} started over")
            if blob.done:
                return False
            if self._stopped:
                raise StreamRestarted(f"the download of {digest.short} stopped")
            self._cond.wait(timeout=0.5)
            return True


@dataclass
class _TeeSink:
    """The ingest, telling the follower about each write (readers then read the file)."""

    follower: BlobFollower
    digest: Digest
    ingest: Ingest

    @property
    def offset(self) -> int:
        return self.ingest.offset

    def write(self, chunk: bytes) -> None:
        self.ingest.write(chunk)
        self.follower.wrote(self.digest)

    def restart(self) -> None:
        self.ingest.restart()
        self.follower.wrote(self.digest, restarted=True)


class _FollowingReader:
    """Reads a partial blob file while it is being written; EOF once the blob is complete."""

    def __init__(self, follower: BlobFollower, digest: Digest, generation: int,
                 file: BinaryIO) -> None:
        self._follower = follower
        self._digest = digest
        self._generation = generation
        self._file = file

    def read(self, size: int = -1) -> bytes:
        size = CHUNK if size is None or size < 0 else size
        while True:
            data = self._file.read(size)
            if data:
                self._follower.check(self._digest, self._generation)
                return data
            if not self._follower.wait_more(self._digest, self._generation):
                return self._file.read(size)  # the last bytes, flushed at commit

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> _FollowingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Decompressed:
    """Decompresses ``raw`` in a thread, hashing the output, for a reader in another thread."""

    def __init__(self, raw: BinaryIO, media_type: str) -> None:
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(QUEUE_CHUNKS)
        self._stop = threading.Event()
        self._buffer = b""
        self._pos = 0
        self._eof = False
        self.hasher = hashlib.sha256()
        self._thread = threading.Thread(target=self._run, args=(raw, media_type),
                                        name="decompress", daemon=True)
        self._thread.start()

    def _put(self, item: bytes | BaseException | None) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, raw: BinaryIO, media_type: str) -> None:
        try:
            stream = open_layer_stream(raw, media_type)
            # read1: hand on what one decompression step gave, do not wait for a full chunk
            read = getattr(stream, "read1", stream.read)
            while not self._stop.is_set():
                chunk = read(CHUNK)
                if not chunk:
                    break
                self.hasher.update(chunk)
                if not self._put(chunk):
                    return
            self._put(None)
        except BaseException as exc:
            self._put(exc)

    def read(self, size: int = -1) -> bytes:
        while self._pos >= len(self._buffer):
            if self._eof:
                return b""
            item = self._queue.get()
            if item is None:
                self._eof = True
                return b""
            if isinstance(item, BaseException):
                self._eof = True
                raise item
            self._buffer, self._pos = item, 0
        if size is None or size < 0:
            size = len(self._buffer) - self._pos
        data = self._buffer[self._pos:self._pos + size]
        self._pos += len(data)
        return data

    def drain(self) -> None:
        while self.read(CHUNK):
            pass

    def close(self, wait: bool = True) -> None:
        """Stop the thread; ``wait=False`` (Ctrl-C) does not wait for a read in progress,
        which may be following a download that is only now being stopped."""
        self._stop.set()
        if wait:
            self._thread.join()


@dataclass(frozen=True)
class AppliedLayers:
    layers: int
    entries: int
    warnings: tuple[str, ...]


def apply_layers(open_blob: Callable[[Digest], BinaryIO], layers: Sequence[Descriptor],
                 diff_ids: Sequence[Digest], rootfs: Path, *, first: int = 1,
                 on_layer: Callable[[int, Descriptor], None] | None = None,
                 budget: UnpackBudget | None = None) -> AppliedLayers:
    """Apply ``layers`` (numbered from ``first``) onto ``rootfs`` in order, checking diff_ids.

    ``open_blob`` gives each layer's compressed bytes (the store, or a :class:`BlobFollower`).
    """
    warnings: list[str] = []
    entries = count = 0
    for n, (layer, diff_id) in enumerate(zip(layers, diff_ids, strict=True), start=first):
        if on_layer is not None:
            on_layer(n, layer)
        with open_blob(layer.digest) as raw:
            stream = _Decompressed(raw, layer.media_type)
            interrupted = False
            try:
                report = apply_layer(stream, rootfs, budget=budget)  # type: ignore[arg-type]
                stream.drain()
            except KeyboardInterrupt:
                interrupted = True
                raise
            finally:
                stream.close(wait=not interrupted)
        actual = stream.hasher.hexdigest()
        if actual != diff_id.hex:
            raise IntegrityError(
                f"layer {n} ({layer.digest.short}) unpacks to sha256:{actual}, but the image "
                f"config says its diff_id is {diff_id}")
        entries += report.entries
        count += 1
        warnings.extend(f"layer {n}: {w}" for w in report.warnings)
    return AppliedLayers(count, entries, tuple(warnings))
