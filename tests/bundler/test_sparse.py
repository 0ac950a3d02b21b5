"""Sparse files and decompression bombs: holes stay holes, and an unpack budget per bundle.

The sparse layers are made by GNU tar (the real producer) in each of its sparse formats: the
old GNU headers and PAX 0.0, 0.1 and 1.0. A 256 MiB file of two 4 KiB blocks gzips to about
150 bytes; written out whole it took 256 MiB of disk.
"""

from __future__ import annotations

import gzip
import io
import subprocess
from pathlib import Path

import pytest

from ocistage.bundler.flows.bundle import make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.pull import PullOptions
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.bundler.unpack.apply import apply_layer
from ocistage.cache.store import Store
from ocistage.cache.unpackbudget import (
    ENTRY_CHARGE,
    UNPACK_FLOOR,
    UnpackBudget,
    default_unpack_limit,
)
from ocistage.errors import LayerError
from pytest_ocistage.components import require_binary
from tests.bundler.tarbuilder import build_tar, file, write_oci_layout

SIZE = 256 << 20
FORMATS = {
    "gnu": ["--format=gnu"],
    "pax-0.0": ["--format=posix", "--sparse-version=0.0"],
    "pax-0.1": ["--format=posix", "--sparse-version=0.1"],
    "pax-1.0": ["--format=posix", "--sparse-version=1.0"],
}


def sparse_layer(tmp_path: Path, fmt: str) -> bytes:
    require_binary("tar")  # GNU tar makes the sparse layers
    work = tmp_path / f"make-{fmt}"
    work.mkdir()
    big = work / "big"
    with open(big, "wb") as out:
        out.write(b"head")
        out.seek(200 << 20)
        out.write(b"tail")
        out.truncate(SIZE)
    subprocess.run(["tar", "--sparse", *FORMATS[fmt], "-cf", str(work / "layer.tar"),
                    "-C", str(work), "big"], check=True)
    return (work / "layer.tar").read_bytes()


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_holes_stay_holes(tmp_path: Path, fmt: str) -> None:
    layer = sparse_layer(tmp_path, fmt)
    assert len(gzip.compress(layer)) < 1000  # the bomb is tiny
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    report = apply_layer(io.BytesIO(layer), rootfs)
    big = rootfs / "big"
    info = big.stat()
    assert info.st_size == SIZE
    assert info.st_blocks * 512 <= 1 << 20, f"{info.st_blocks * 512} bytes allocated"
    assert report.bytes_written <= 16 << 10
    with open(big, "rb") as data:
        assert data.read(4) == b"head"
        data.seek(200 << 20)
        assert data.read(4) == b"tail"
        data.seek(100 << 20)
        assert data.read(4096) == bytes(4096)


def test_the_budget_counts_data_not_holes(tmp_path: Path) -> None:
    layer = sparse_layer(tmp_path, "pax-1.0")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    apply_layer(io.BytesIO(layer), rootfs, budget=UnpackBudget(64 << 10))


def test_a_bomb_stops_at_the_budget(tmp_path: Path) -> None:
    bomb = build_tar([file(f"zeros{n}", bytes(4 << 20)) for n in range(8)])  # 32 MiB
    assert len(gzip.compress(bomb)) < 64 << 10
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    budget = UnpackBudget(10 << 20)
    with pytest.raises(LayerError, match="unpack limit"):
        apply_layer(io.BytesIO(bomb), rootfs, budget=budget)
    assert budget.used <= (10 << 20) + (1 << 20)  # stopped within a chunk of the limit
    written = sum(p.stat().st_size for p in rootfs.iterdir())
    assert written <= 12 << 20


def test_bundle_enforces_the_configured_limit(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_oci_layout(layout, [build_tar([file("bin/tool", b"t" * (2 << 20), mode=0o755)])],
                     tag="t", kind="gzip")
    store = Store.open(tmp_path / "cache")
    source = parse_reference(f"oci:{layout}:t")
    run = ConfigOptions(args=["/bin/tool"])
    with pytest.raises(LayerError, match="unpack limit"):
        make_bundle(source, store, tmp_path / "small", config_options=run,
                    pull_options=PullOptions(unpack_limit=1 << 20))
    assert not (tmp_path / "small").exists()
    made = make_bundle(source, store, tmp_path / "big", config_options=run,
                       pull_options=PullOptions(unpack_limit=4 << 20))
    assert (made.path / "rootfs/bin/tool").stat().st_size == 2 << 20


def test_the_default_limit() -> None:
    assert default_unpack_limit(308) == UNPACK_FLOOR
    assert default_unpack_limit(1 << 30) == 100 << 30


def test_a_flood_of_empty_files_stops_at_the_budget(tmp_path: Path) -> None:
    # 20 000 empty files: no file data at all, 10 MB of tar that gzips to ~150 KB, and one
    # inode each; at 1 KiB an entry they exceed a 10 MiB budget half-way
    flood = build_tar([file(f"d{n // 1000}/e{n}", b"") for n in range(20_000)])
    assert len(gzip.compress(flood)) < 1 << 20
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    budget = UnpackBudget(10 << 20)
    with pytest.raises(LayerError, match=r"(?s)each counts .*unpack limit"):
        apply_layer(io.BytesIO(flood), rootfs, budget=budget)
    made = sum(1 for path in rootfs.rglob("*") if path.is_file())
    assert made <= (10 << 20) // ENTRY_CHARGE + 1
    assert budget.used == (10 << 20) + ENTRY_CHARGE  # the entry that went over is not made


def test_entries_of_a_real_image_fit_the_floor_many_times() -> None:
    assert UNPACK_FLOOR // ENTRY_CHARGE >= 4_000_000  # a few 100k entries in real images
