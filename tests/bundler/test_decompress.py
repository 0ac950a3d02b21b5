from __future__ import annotations

import gzip
import io
import os
import zlib
from typing import BinaryIO

import pytest
import zstandard

from ocistage.bundler.unpack import decompress as decompress_module
from ocistage.bundler.unpack.decompress import detect_compression, open_layer_stream
from ocistage.errors import LayerError


@pytest.fixture(autouse=True, params=["isal", "zlib"])
def inflate(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with ISA-L's inflate and with zlib's (the fallback without isal)."""
    if request.param == "isal":
        from isal import isal_zlib
        assert decompress_module._INFLATE is isal_zlib  # isal is a dependency: it is used
    else:
        monkeypatch.setattr(decompress_module, "_INFLATE", zlib)
    return str(request.param)


class TrickleReader(io.RawIOBase):
    """A source that returns at most ``step`` bytes per read, to exercise short reads."""

    def __init__(self, data: bytes, step: int = 3) -> None:
        self._data = memoryview(data)
        self._step = step
        self.largest_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self._step, len(self._data))
        buffer[:count] = self._data[:count]
        self._data = self._data[count:]
        return count


def read_all(stream: BinaryIO, size: int = 7777) -> bytes:
    out = bytearray()
    while True:
        chunk = stream.read(size)
        if not chunk:
            return bytes(out)
        out += chunk


PAYLOAD = os.urandom(300_000) + b"tar" * 100_000


def test_detects_by_magic_not_media_type() -> None:
    assert detect_compression(b"\x1f\x8b\x08\x00") == "gzip"
    assert detect_compression(b"\x28\xb5\x2f\xfd") == "zstd"
    assert detect_compression(b"ustar") == "none"
    assert detect_compression(b"") == "none"
    plain = io.BytesIO(PAYLOAD)
    assert read_all(open_layer_stream(plain, "application/vnd.oci.image.layer.v1.tar+gzip")) \
        == PAYLOAD


@pytest.mark.parametrize("head,name", [(b"BZh91AY", "bzip2"), (b"\xfd7zXZ\x00\x00", "xz")])
def test_refuses_bzip2_and_xz(head: bytes, name: str) -> None:
    with pytest.raises(LayerError, match=name):
        open_layer_stream(io.BytesIO(head + b"\x00" * 10))


def test_gzip_round_trip_with_short_reads() -> None:
    blob = gzip.compress(PAYLOAD)
    stream = open_layer_stream(TrickleReader(blob, step=1000))  # type: ignore[arg-type]
    assert read_all(stream) == PAYLOAD


def test_multi_member_gzip_and_nul_padding() -> None:
    blob = gzip.compress(PAYLOAD[:1000]) + gzip.compress(PAYLOAD[1000:]) + b"\x00" * 1024
    assert read_all(open_layer_stream(io.BytesIO(blob))) == PAYLOAD


def test_gzip_truncated_is_an_error() -> None:
    blob = gzip.compress(PAYLOAD)
    with pytest.raises(LayerError, match="truncated"):
        read_all(open_layer_stream(io.BytesIO(blob[:-20])))


def test_gzip_corrupt_and_trailing_garbage_are_errors() -> None:
    blob = bytearray(gzip.compress(PAYLOAD))
    blob[100] ^= 0xFF
    with pytest.raises(LayerError, match="corrupt"):
        read_all(open_layer_stream(io.BytesIO(bytes(blob))))
    with pytest.raises(LayerError, match="trailing garbage"):
        read_all(open_layer_stream(io.BytesIO(gzip.compress(b"abc") + b"junk")))


def test_gzip_bomb_output_is_bounded_per_read() -> None:
    """A tiny blob expanding to 256 MiB decompresses in bounded steps (no huge buffer)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\x00" * (1 << 20)
    blob = b"".join(compressor.compress(zeros) for _ in range(256)) + compressor.flush()
    assert len(blob) < 1 << 20
    stream = open_layer_stream(io.BytesIO(blob))
    total = 0
    while chunk := stream.read(1 << 20):
        assert len(chunk) <= 1 << 20
        total += len(chunk)
    assert total == 256 << 20


def test_zstd_multiple_frames() -> None:
    compressor = zstandard.ZstdCompressor()
    blob = compressor.compress(PAYLOAD[:5000]) + compressor.compress(PAYLOAD[5000:])
    stream = open_layer_stream(TrickleReader(blob, step=4096))  # type: ignore[arg-type]
    assert read_all(stream) == PAYLOAD


def test_zstd_streaming_compressor_output() -> None:
    out = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as writer:
        writer.write(PAYLOAD)
    assert read_all(open_layer_stream(io.BytesIO(out.getvalue()))) == PAYLOAD


def _zstd_with_window(window_log: int) -> bytes:
    """PAYLOAD in one frame that declares a window of 2**window_log (no content size, as a
    streaming compressor writes it, so the decoder cannot shrink the window)."""
    params = zstandard.ZstdCompressionParameters(window_log=window_log, enable_ldm=True,
                                                 write_content_size=False)
    out = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(
            out, closefd=False) as writer:
        writer.write(PAYLOAD)
    blob = out.getvalue()
    assert zstandard.get_frame_parameters(blob).window_size == 1 << window_log
    return blob


def test_zstd_long_window_up_to_the_limit_is_read() -> None:
    assert read_all(open_layer_stream(io.BytesIO(_zstd_with_window(27)))) == PAYLOAD


def test_zstd_window_over_the_limit_is_refused_with_its_reason() -> None:
    with pytest.raises(LayerError, match="window larger than 128 MiB") as raised:
        read_all(open_layer_stream(io.BytesIO(_zstd_with_window(28))))
    assert "--long=27" in raised.value.hint


def test_zstd_corrupt_is_an_error() -> None:
    blob = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(PAYLOAD))
    blob[1000] ^= 0xFF
    with pytest.raises(LayerError, match="zstd"):
        read_all(open_layer_stream(io.BytesIO(bytes(blob))))


def test_plain_short_stream() -> None:
    assert read_all(open_layer_stream(io.BytesIO(b"ab"))) == b"ab"
    assert read_all(open_layer_stream(io.BytesIO(b""))) == b""
