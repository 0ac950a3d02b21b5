"""A cache on a full filesystem can still be cleaned by ocistage (issue 39's endurance test:
every member's `cache gc --max-size 0` failed with ENOSPC, left an empty gc.lock that made
the next gc wait a minute, and `unstage` could not record its removal's lease). Run on a real
size-limited tmpfs, filled to its last block."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache import reserve
from ocistage.cache.errors import StoreError
from ocistage.cache.gc import GcOptions, collect
from ocistage.cache.locks import FileLock
from ocistage.cache.store import Store
from tests.soak import tmpfs

pytestmark = pytest.mark.needs_root("mounting a small tmpfs needs root")


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "fs", "8m") as mounted:
        yield mounted


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until the filesystem has no block left."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as out:  # unbuffered: nothing left for close to write
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    out.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    with pytest.raises(OSError):  # nothing more fits, not even a small file
        (directory / "probe").write_bytes(b"x" * 4096)
    return filler


def test_a_lock_that_cannot_be_written_is_not_left_behind(small: Path) -> None:
    fill(small)
    lock = FileLock(small / "gc.lock")
    with pytest.raises(StoreError, match="cannot write lock file"):
        lock.acquire(timeout=1)
    assert not (small / "gc.lock").exists()  # an empty one made the next gc wait a minute


def test_gc_empties_a_cache_on_a_full_filesystem(small: Path) -> None:
    store = Store.open(small / "cache")
    assert (store.root / reserve.NAME).stat().st_blocks * 512 >= reserve.SIZE
    digest = store.put_blob(os.urandom(3 << 20))  # nothing refers to it: gc takes it
    fill(small)
    started = time.monotonic()
    report = collect(store, GcOptions(max_size=0))
    assert time.monotonic() - started < 30
    assert not store.has_blob(digest)
    assert any(r.kind == "blob" for r in report.removed)
    assert not (store.root / "gc.lock").exists()
    # and the reserve is back, from what gc freed
    assert (store.root / reserve.NAME).stat().st_blocks * 512 >= reserve.SIZE


def test_the_reserve_is_what_no_gc_removes(small: Path) -> None:
    store = Store.open(small / "cache")
    report = collect(store, GcOptions(max_size=0))
    assert report.size_floor >= reserve.SIZE and report.size_after == report.size_floor
    assert (store.root / reserve.NAME).stat().st_blocks * 512 >= reserve.SIZE


def test_a_reserve_that_is_no_file_of_ours_is_left_alone(small: Path) -> None:
    root = small / "cache"
    root.mkdir()
    os.mkfifo(root / reserve.NAME)
    reserve.ensure(root)  # returns: never waits on a FIFO it did not make
    with reserve.spent(root):
        pass
    assert (root / reserve.NAME).is_fifo()


def test_unstage_on_a_full_filesystem(small: Path, tmp_path: Path) -> None:
    """unstage records its removal's lease before it removes anything (so a killed unstage
    is finished later); on a full filesystem that write failed and the bundle stayed."""
    from ocistage.stagers.directory import stage_directory
    from ocistage.stagers.unstage import unstage
    from tests.stagers.conftest import make_tree

    store = Store.open(small / "cache")
    staged = stage_directory(make_tree(tmp_path / "bundle"), small / "target",
                             cache_root=store.root, link=False)
    fill(small)
    assert unstage(Path(staged.path), cache_root=store.root)
    assert not Path(staged.path).exists()


def test_a_squashfs_stage_that_cannot_unpack_leaves_no_unmarked_directory(
        small: Path, tmp_path: Path) -> None:
    """Where the image cannot be mounted (an ordinary user: /dev/fuse is root's here) it is
    unpacked; that failing (here: no space for the unpacked tree) left an empty NAME/ without
    a marker, which unstage refused ('was not staged by ocistage') and nothing removed."""
    from ocistage.stagers.directory import stage_directory
    from ocistage.stagers.errors import StageError
    from ocistage.stagers.unstage import unstage
    from tests.stagers.conftest import make_tree

    source = make_tree(tmp_path / "bundle")
    (source / "zeros").write_bytes(bytes(12 << 20))  # squashes to nothing, unpacks to 12 MiB
    store = Store.open(small / "cache")
    with pytest.raises(StageError):
        stage_directory(source, small / "target", cache_root=store.root, name="app",
                        format="squashfs", squashfs_mount=False)
    assert not (small / "target" / "app").exists()
    assert not (small / "target" / "app.sqfs").exists()  # no image nobody would ever remove
    assert not unstage(small / "target" / "app", cache_root=store.root)
