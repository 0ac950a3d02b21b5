"""Streaming decompression of layer blobs, detected by magic bytes.

The compression of a layer is taken from its first bytes, not from its media type: registries
and old tools mislabel layers (a ``tar+gzip`` media type on a plain tar and the reverse). gzip
(``1f 8b``) is decompressed with ISA-L's zlib-compatible inflate (:mod:`zlib` without it), one
member after another (``pigz`` and some builders write multi-member files); zstd
(``28 b5 2f fd``) with :mod:`zstandard`, across frames; anything else is passed through as a
plain tar. bzip2 and xz are recognised and refused.

Memory stays bounded whatever the input: each ``read`` decompresses at most the requested number
of bytes (``max_length``), so a small highly compressed blob cannot balloon in memory; a zstd
frame's window (the history its decoder keeps) may be at most :data:`ZSTD_MAX_WINDOW`.
"""

from __future__ import annotations

import contextlib
import io
import zlib
from collections.abc import Iterator
from types import ModuleType
from typing import BinaryIO

import zstandard

from ocistage.errors import LayerError

_INFLATE: ModuleType = zlib
with contextlib.suppress(ImportError):  # ISA-L's inflate: zlib's API, ~2.7x faster here
    from isal import isal_zlib as _INFLATE

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_REFUSED = {b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}

CHUNK = 1 << 20
# The largest zstd window accepted (zstd's own default limit, ``--long=27``). A frame's window
# is history the decoder must hold in memory whatever the read size: a layer compressed with
# ``--long=27`` costs 128 MiB of RSS while it is read (``zstd -dc`` itself: ~132 MB).
ZSTD_MAX_WINDOW = 1 << 27
_HINT = "the layer blob is corrupt or truncated; remove it from the cache and pull again"


def detect_compression(head: bytes) -> str:
    """``"gzip"``, ``"zstd"`` or ``"none"`` for a blob starting with ``head``."""
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    for magic, name in _REFUSED.items():
        if head.startswith(magic):
            raise LayerError(f"{name}-compressed layers are not supported",
                             "OCI layers are plain tar, gzip or zstd; rebuild the image")
    return "none"


def open_layer_stream(raw: BinaryIO, media_type: str | None = None) -> BinaryIO:
    """A readable stream of the uncompressed tar inside ``raw``.

    ``media_type`` is informative only; the magic bytes decide. ``raw`` is read sequentially
    in chunks and never seeked; the returned stream does not close it.
    """
    head = _read_exactly(raw, 6)
    source = _Prefixed(head, raw)
    kind = detect_compression(head)
    reader: io.RawIOBase
    if kind == "gzip":
        reader = _GzipReader(source)
    elif kind == "zstd":
        reader = _ZstdReader(source)
    else:
        reader = source
    return io.BufferedReader(reader, buffer_size=CHUNK)


def _read_exactly(raw: BinaryIO, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = raw.read(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


class _Prefixed(io.RawIOBase):
    """``raw`` with the bytes already peeked from it put back in front."""

    def __init__(self, head: bytes, raw: BinaryIO) -> None:
        self._head = head
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._head:
            count = min(len(view), len(self._head))
            view[:count] = self._head[:count]
            self._head = self._head[count:]
            return count
        data = self._raw.read(len(view))
        view[:len(data)] = data
        return len(data)


class _Decoder(io.RawIOBase):
    """A raw reader filled from a generator of decompressed chunks of bounded size."""

    def __init__(self) -> None:
        self._pending = b""
        self._chunks: Iterator[bytes] = self._decode()

    def _decode(self) -> Iterator[bytes]:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = chunk
        count = min(len(view), len(self._pending))
        view[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


class _GzipReader(_Decoder):
    def __init__(self, source: io.RawIOBase) -> None:
        self._source = source
        super().__init__()

    def _decode(self) -> Iterator[bytes]:
        decoder = _INFLATE.decompressobj(wbits=31)
        data = self._source.read(CHUNK) or b""
        while True:
            try:
                out = decoder.decompress(data, CHUNK)
            except _INFLATE.error as exc:
                raise LayerError(f"gzip layer is corrupt: {exc}", _HINT) from exc
            data = decoder.unconsumed_tail
            if out:
                yield out
            if decoder.eof:
                rest = self._skip_padding(decoder.unused_data + data)
                if rest is None:
                    return
                decoder = _INFLATE.decompressobj(wbits=31)
                data = rest
            elif not out and not data:
                data = self._source.read(CHUNK) or b""
                if not data:
                    raise LayerError("gzip layer is truncated", _HINT)

    def _skip_padding(self, rest: bytes) -> bytes | None:
        """After a gzip member: the next member's bytes, or ``None`` at the end.

        Trailing NUL padding (written by some tools) is accepted; other trailing bytes are an
        error rather than silently ignored.
        """
        while True:
            stripped = rest.lstrip(b"\x00")
            if stripped:
                if not GZIP_MAGIC.startswith(stripped[:2]):
                    raise LayerError("gzip layer has trailing garbage after its last member",
                                     _HINT)
                if len(stripped) >= 2:
                    return stripped
            more = self._source.read(CHUNK) or b""
            if not more:
                if stripped:
                    raise LayerError("gzip layer is truncated", _HINT)
                return None
            rest = stripped + more


class _ZstdReader(_Decoder):
    def __init__(self, source: io.RawIOBase) -> None:
        self._source = source
        super().__init__()

    def _decode(self) -> Iterator[bytes]:
        decompressor = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
        source: BinaryIO = self._source  # type: ignore[assignment]
        reader = decompressor.stream_reader(source, read_size=CHUNK,
                                            read_across_frames=True, closefd=False)
        with reader:
            while True:
                try:
                    out = reader.read(CHUNK)
                except zstandard.ZstdError as exc:
                    if "too much memory" in str(exc):
                        raise LayerError(
                            f"zstd layer needs a decompression window larger than "
                            f"{ZSTD_MAX_WINDOW >> 20} MiB, the most ocistage holds in memory",
                            "recompress the layer with a smaller window (zstd --long=27 or "
                            "less; the default level's window is 8 MiB or less)") from exc
                    raise LayerError(f"zstd layer is corrupt: {exc}", _HINT) from exc
                if not out:
                    return
                yield out
