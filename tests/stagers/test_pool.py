from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocistage.cache.targetlayout import sweep_pool
from ocistage.stagers.copy import Copier
from ocistage.stagers.filemanifest import hash_file
from ocistage.stagers.pool import Pool, pool_key


def test_equal_contents_are_stored_once(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"shared content\n")
    pool = Pool.of_target(tmp_path / "target")
    pool.prepare()
    out = tmp_path / "target" / "b"
    out.mkdir()
    key = pool_key(hash_file(src), 0o644)
    copier = Copier()
    assert pool.link_into(str(src), key, 0o644, 1_000_000_000, str(out / "one"), copier)
    assert not pool.link_into(str(src), key, 0o644, 1_000_000_000, str(out / "two"), copier)
    one, two = (out / "one").stat(), (out / "two").stat()
    assert one.st_ino == two.st_ino == pool.path(key).stat().st_ino
    assert one.st_mode & 0o777 == 0o644 and one.st_mtime_ns == 1_000_000_000
    assert (out / "two").read_bytes() == b"shared content\n"
    # no temp files are left in the pool
    assert os.listdir(pool.path(key).parent) == [key]


def test_release_removes_only_unused_entries(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x")
    pool = Pool.of_target(tmp_path / "t")
    (tmp_path / "t").mkdir()
    used, unused = pool_key("11" * 16, 0o644), pool_key("22" * 16, 0o755)
    pool.link_into(str(src), used, 0o644, 0, str(tmp_path / "t" / "a"), Copier())
    pool.link_into(str(src), unused, 0o755, 0, str(tmp_path / "t" / "b"), Copier())
    (tmp_path / "t" / "b").unlink()
    assert pool.release({used, unused, pool_key("33" * 16, 0o644)}) == 1
    assert pool.path(used).exists() and not pool.path(unused).exists()


def test_a_removed_entry_is_copied_again(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"again")
    pool = Pool.of_target(tmp_path / "t")
    (tmp_path / "t").mkdir()
    key = pool_key("44" * 16, 0o600)
    pool.link_into(str(src), key, 0o600, 0, str(tmp_path / "t" / "a"), Copier())
    pool.path(key).unlink()  # a concurrent unstage released it
    assert pool.link_into(str(src), key, 0o600, 0, str(tmp_path / "t" / "b"), Copier())
    assert (tmp_path / "t" / "b").read_bytes() == b"again"


def test_sweep_removes_every_unlinked_entry(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x")
    pool = Pool.of_target(tmp_path / "t")
    (tmp_path / "t").mkdir()
    keys = [pool_key(f"{n:02x}" * 16, 0o644) for n in range(5)]
    for n, key in enumerate(keys):
        pool.link_into(str(src), key, 0o644, 0, str(tmp_path / "t" / f"b{n}"), Copier())
    for n in (1, 3):
        (tmp_path / "t" / f"b{n}").unlink()  # e.g. a killed stager's scratch, removed
    assert sweep_pool(tmp_path / "t") == 2  # what cache gc and unstage run
    assert [pool.path(k).exists() for k in keys] == [True, False, True, False, True]


def test_prepare_makes_the_missing_fan_out_directories_only(tmp_path: Path) -> None:
    """A second prepare (every re-stage) lists the pool instead of trying 256 mkdirs; fan-out
    directories removed meanwhile are made again, and one that is a file is still refused."""
    pool = Pool.of_target(tmp_path / "t")
    pool.prepare()
    assert sorted(os.listdir(pool.root)) == [f"{n:02x}" for n in range(256)]
    (pool.root / "00").rmdir()
    (pool.root / "ff").rmdir()
    pool.prepare()
    assert sorted(os.listdir(pool.root)) == [f"{n:02x}" for n in range(256)]
    (pool.root / "7f").rmdir()
    (pool.root / "7f").write_bytes(b"not a directory")
    with pytest.raises(FileExistsError):
        pool.prepare()
