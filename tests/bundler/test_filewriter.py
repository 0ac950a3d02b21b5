"""bundler.filewriter: files finished in a thread, in order, every descriptor closed once."""

from __future__ import annotations

import errno
import io
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bundler.filewriter import BATCH_BYTES, BATCH_FILES, FileMeta, FileWriter
from bundler.layers import apply_layer
from cache.errors import LayerError
from tests.bundler.tarbuilder import build_tar, file

MTIME = 1_600_000_000_123_456_789


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def meta(mode: int = 0o640, label: str = "f") -> FileMeta:
    return FileMeta(mode, MTIME, None, {}, label)


def create(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)


def test_files_get_data_mode_and_times_in_order(tmp_path: Path) -> None:
    before = open_fds()
    warnings: list[str] = []
    sizes = [0, 1, BATCH_BYTES - 1, BATCH_BYTES + 1, 3 * BATCH_BYTES, 10]
    with FileWriter(warnings.append) as writer:
        for n in range(3 * BATCH_FILES):  # several batches of small files
            fd = create(tmp_path / f"small{n}")
            writer.write(fd, b"%d" % n)
            writer.finish(fd, meta(0o4755 if n == 7 else 0o444))
        for n, size in enumerate(sizes):  # files written in several chunks
            fd = create(tmp_path / f"big{n}")
            for start in range(0, size, 1 << 20):
                writer.write(fd, bytes([n]) * min(1 << 20, size - start))
            writer.finish(fd, meta())
    assert open_fds() == before
    assert warnings == []
    for n in range(3 * BATCH_FILES):
        info = (tmp_path / f"small{n}").stat()
        assert (tmp_path / f"small{n}").read_bytes() == b"%d" % n
        assert stat.S_IMODE(info.st_mode) == (0o4755 if n == 7 else 0o444)  # setuid kept
        assert info.st_mtime_ns == MTIME
    for n, size in enumerate(sizes):
        assert (tmp_path / f"big{n}").read_bytes() == bytes([n]) * size


def test_xattrs_refused_by_the_filesystem_become_warnings(tmp_path: Path) -> None:
    warnings: list[str] = []
    with FileWriter(warnings.append) as writer:
        fd = create(tmp_path / "f")
        writer.finish(fd, FileMeta(0o600, MTIME, None, {"nonamespace.k": b"v"}, "etc/f"))
    assert len(warnings) == 1 and warnings[0].startswith("etc/f: xattr nonamespace.k not set")


def test_the_first_error_is_raised_and_every_descriptor_closed(tmp_path: Path) -> None:
    before = open_fds()
    writer = FileWriter(lambda message: None)
    read_only = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)  # write() fails with EISDIR/EBADF
    writer.write(read_only, b"data")
    writer.finish(read_only, meta())
    later = [create(tmp_path / f"later{n}") for n in range(5)]
    for fd in later:
        writer.finish(fd, meta())
    with pytest.raises(OSError) as raised:
        writer.close()
    assert raised.value.errno in (errno.EBADF, errno.EISDIR)
    assert open_fds() == before
    # work after the error is not done: the later files keep the mode they were created with
    assert stat.S_IMODE((tmp_path / "later4").stat().st_mode) == 0o600


def test_an_error_reaches_the_caller_at_a_later_batch(tmp_path: Path) -> None:
    before = open_fds()
    with pytest.raises(OSError), FileWriter(lambda message: None) as writer:
        bad = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        writer.write(bad, b"x" * BATCH_BYTES)  # a full batch: handed to the thread now
        writer.finish(bad, meta())
        for n in range(1000):  # the caller learns of the error before the end
            fd = create(tmp_path / f"f{n}")
            try:
                writer.write(fd, b"x" * (BATCH_BYTES // 4))
            except OSError:
                writer.discard(fd)  # the protocol: every file ends in finish() or discard()
                raise
            writer.finish(fd, meta())
    assert open_fds() == before
    assert len(list(tmp_path.iterdir())) < 1000


def test_abort_closes_everything_and_drops_errors(tmp_path: Path) -> None:
    before = open_fds()
    with pytest.raises(KeyError), FileWriter(lambda message: None) as writer:
        for n in range(10):
            fd = create(tmp_path / f"f{n}")
            writer.write(fd, b"data")
            writer.finish(fd, meta())
        pending = create(tmp_path / "pending")
        writer.write(pending, b"half")
        writer.discard(pending)
        raise KeyError("the caller failed")
    assert open_fds() == before


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mountpoint)],
                   check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_a_full_filesystem_is_a_layer_error_with_a_hint(tiny_tmpfs: Path) -> None:
    before = open_fds()
    rootfs = tiny_tmpfs / "rootfs"
    rootfs.mkdir()
    layer = build_tar([file(f"data/f{n}", b"y" * 100_000) for n in range(8)])
    with pytest.raises(LayerError) as raised:
        apply_layer(io.BytesIO(layer), rootfs)
    assert "No space left on device" in str(raised.value)
    assert "free some space" in (raised.value.hint or "")
    assert open_fds() == before
