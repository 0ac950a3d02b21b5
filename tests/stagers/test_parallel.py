"""Forked workers for many small file operations: results in order, errors re-raised, and a
first stage of thousands of files through them equal to the source."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import xxhash

from cache.leases import Holder
from stagers import stage as stage_module
from stagers.filemanifest import MANIFEST_NAME
from stagers.parallel import batches, map_processes
from stagers.stage import stage_directory


def _square_in_child(n: int) -> tuple[int, int]:
    return n * n, os.getpid()


def test_results_come_back_in_order_from_several_processes() -> None:
    results = map_processes(_square_in_child, list(range(500)), 3)
    assert [r for r, _pid in results] == [n * n for n in range(500)]
    assert len({pid for _r, pid in results}) == 3
    assert os.getpid() in {pid for _r, pid in results}  # the caller does a share too


def _fail_on_400(n: int) -> int:
    if n == 400:
        raise FileNotFoundError(errno.ENOENT, "gone", f"/x/{n}")
    return n


def test_an_error_in_a_child_is_raised_in_the_caller() -> None:
    with pytest.raises(FileNotFoundError) as info:
        map_processes(_fail_on_400, list(range(500)), 2)
    assert info.value.filename == "/x/400" and info.value.errno == errno.ENOENT


def test_batches_are_contiguous_and_cover_everything() -> None:
    items = list(range(1000))
    parts = batches(items, lambda n: n, 4)
    assert len(parts) == 4 and [n for part in parts for n in part] == items


def test_a_first_stage_of_thousands_of_files_through_forked_workers(
        tmp_path: Path, other_fs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage_module, "FORK_MIN_FILES", 100)
    monkeypatch.setattr(stage_module, "usable_cpus", lambda: 2)
    source = tmp_path / "src"
    for n in range(600):
        directory = source / f"d{n % 7}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{n}").write_bytes(b"%d " % (n % 450) * (n % 50 + 1))  # duplicates
        os.chmod(directory / f"f{n}", 0o644 if n % 3 else 0o755)
    big = source / "big"
    big.write_bytes(os.urandom(3 << 20))  # more than one read chunk
    result = stage_directory(source, other_fs, cache_root=tmp_path / "cache",
                             holder=Holder.pin("t"), jobs=4)
    assert result.method == "pool" and result.files == 601
    assert result.copied + result.linked == 601 and result.linked > 0  # equal contents pooled
    manifest = json.loads((result.path / MANIFEST_NAME).read_bytes())
    for path, kind, mode, _size, _mtime, _dev, _ino, digest, _target in manifest["entries"]:
        if kind != "file":
            continue
        staged = result.path / path
        data = staged.read_bytes()
        assert data == (source / path).read_bytes()
        assert digest == xxhash.xxh3_128(data).hexdigest()
        assert staged.stat().st_mode & 0o7777 == mode == (source / path).stat().st_mode & 0o7777
        links = staged.stat().st_nlink
        assert links >= 2  # the bundle's name and the pool's (and equal files elsewhere)
        if links == 2:  # a pooled file keeps the mtime of its first copy
            assert staged.stat().st_mtime_ns == (source / path).stat().st_mtime_ns
    twins = {p.name for p in other_fs.rglob("*.ocistage-twin")}
    assert twins == set()
    again = stage_directory(source, other_fs, cache_root=tmp_path / "cache",
                            holder=Holder.pin("t"), jobs=4)
    assert again.unchanged == again.files
