"""Unpack an image's layers while they download, into snapshots of the cache or a scratch rootfs.

The pipeline for one image (``docs/performance.md`` has the measurements behind it)::

    registry --HTTP--> pull thread(s): hash + write ingest/<hex>.partial   (one per layer)
                                         |  (BlobFollower: readers follow the growing file)
                       decompress thread: read, gunzip/unzstd, hash (diff_id) --queue-->
                       main thread: tar parse + write files
                       (ocistage.bundler.unpack.apply.apply_layer)

A layer is read from the store once its blob is complete, or from its growing download
(:class:`ocistage.bundler.follower.BlobFollower`).

Layers are applied in order into one scratch rootfs; layer N+1 downloads while layer N is
being applied, and decompression runs beside tar parsing (zlib, zstd and hashlib release the
GIL). Nothing is published before the pull finished (every blob verified against its digest
at commit) and every layer's uncompressed stream matched its diff_id: the scratch tree is then
renamed into place (a snapshot, by :mod:`ocistage.cache.snapshots`) or thrown away.

If a download has to start over (the server ignored ``Range``, or the blob failed
verification), the bytes already unpacked may not be the blob's: the reader raises
:class:`ocistage.bundler.follower.StreamRestarted` and the caller starts again from the verified
blobs.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ocistage.bundler.image.manifest import Descriptor
from ocistage.bundler.unpack.apply import apply_layer
from ocistage.bundler.unpack.decompress import open_layer_stream
from ocistage.cache.digest import Digest
from ocistage.cache.notice import Notice
from ocistage.cache.unpackbudget import UnpackBudget
from ocistage.errors import IntegrityError

CHUNK = 1 << 20
QUEUE_CHUNKS = 8  # decompressed MiB in flight between the decompress and the tar thread


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
    warnings: tuple[Notice, ...]
    unreadable: int = 0   # files made that their owner may not read (ApplyReport)
    links: int = 0        # hard links made


def apply_layers(open_blob: Callable[[Digest], BinaryIO], layers: Sequence[Descriptor],
                 diff_ids: Sequence[Digest], rootfs: Path, *, first: int = 1,
                 on_layer: Callable[[int, Descriptor], None] | None = None,
                 budget: UnpackBudget | None = None, rootless: bool = True) -> AppliedLayers:
    """Apply ``layers`` (numbered from ``first``) onto ``rootfs`` in order, checking diff_ids.

    ``open_blob`` gives each layer's compressed bytes (the store, or a :class:`BlobFollower`).
    ``rootless=False`` (root only): the image's owners and device nodes
    (:func:`ocistage.bundler.unpack.apply.apply_layer`).
    """
    warnings: list[Notice] = []
    entries = count = unreadable = links = 0
    for n, (layer, diff_id) in enumerate(zip(layers, diff_ids, strict=True), start=first):
        if on_layer is not None:
            on_layer(n, layer)
        with open_blob(layer.digest) as raw:
            stream = _Decompressed(raw, layer.media_type)
            interrupted = False
            try:
                report = apply_layer(stream, rootfs,  # type: ignore[arg-type]
                                     budget=budget, rootless=rootless)
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
        unreadable += report.unreadable
        links += report.links
        count += 1
        warnings.extend(warning.in_layer(n) for warning in report.warnings)
    return AppliedLayers(count, entries, tuple(warnings), unreadable, links)
