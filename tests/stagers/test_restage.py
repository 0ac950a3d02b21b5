"""A changed tree re-staged through the pool in one pass (:mod:`ocistage.stagers.restage`): the
walk's workers place what they walked. Whatever changed in the source (contents, modes, times,
xattrs, files and directories added or removed, a file become a directory), the new version
and its manifest are the source's, as the general way makes them: every entry in walk order
with its stat, hash and xattr digest, the digest of the marker the next re-stage finds
unchanged, and no pool entry left that no bundle links."""

from __future__ import annotations

import os
import random
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ocistage.cache.leases import Holder
from ocistage.stagers import restage, xattrs
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.filemanifest import (
    MANIFEST_NAME,
    Manifest,
    Record,
    hash_file,
    load_manifest,
    scan,
    stat_digest,
)
from ocistage.stagers.markers import read_marker
from tests.removers import settle

_real_place_subtrees = restage.place_subtrees

CHANGES = ("content", "touch", "chmod", "new-file", "remove-file", "new-dir", "remove-dir",
           "symlink", "xattr", "file-to-dir", "same-bytes")


def _source(root: Path) -> Path:
    for a in range(4):
        for b in range(3):
            directory = root / f"d{a}" / f"e{b}"
            directory.mkdir(parents=True)
            for n in range(4):
                (directory / f"f{n}").write_bytes(b"%d %d %d\n" % (a, b, n) * (n + 1))
            os.symlink("f0", directory / "link")
        (root / f"d{a}" / "top").write_bytes(b"top %d\n" % a)
    (root / "config.json").write_bytes(b'{"root": {"path": "rootfs"}}\n')
    return root


def _change(root: Path, how: str, rng: random.Random) -> None:
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()
                   and p.name != "config.json")
    dirs = sorted(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())
    target = rng.choice(files) if files else None
    if how == "content" and target is not None:
        target.write_bytes(b"changed %d\n" % rng.randrange(1000))
    elif how == "touch" and target is not None:  # a new mtime, the same bytes
        os.utime(target, ns=(1, rng.randrange(1, 1 << 40)))
    elif how == "same-bytes" and target is not None:  # rewritten as it was: a new ctime
        target.write_bytes(target.read_bytes())
    elif how == "chmod" and target is not None:
        target.chmod(0o755 if target.stat().st_mode & 0o100 == 0 else 0o640)
    elif how == "new-file" and dirs:
        (rng.choice(dirs) / f"new{rng.randrange(1000)}").write_bytes(b"new\n")
    elif how == "remove-file" and target is not None:
        target.unlink()
    elif how == "new-dir" and dirs:
        new = rng.choice(dirs) / f"nd{rng.randrange(1000)}"
        new.mkdir(exist_ok=True)
        (new / "inside").write_bytes(b"inside\n")
    elif how == "remove-dir" and dirs:
        shutil.rmtree(rng.choice(dirs))
    elif how == "symlink" and dirs:
        link = rng.choice(dirs) / "link"
        if link.is_symlink():
            link.unlink()
        if not link.exists():
            os.symlink(f"../elsewhere{rng.randrange(9)}", link)
    elif how == "xattr" and target is not None:
        try:
            os.setxattr(target, "user.test", b"v%d" % rng.randrange(1000))
        except OSError:  # no user xattrs on this filesystem
            target.write_bytes(b"no xattrs\n")
    elif how == "file-to-dir" and target is not None:
        target.unlink()
        target.mkdir()
        (target / "now").write_bytes(b"a directory now\n")


def _check(source: Path, staged: Path) -> None:
    """``staged`` and its manifest are ``source``'s."""
    manifest = load_manifest(staged / MANIFEST_NAME)
    assert manifest is not None
    scanned = scan(source)
    assert [e.path for e in manifest.entries] == [e.path for e in scanned]
    for entry, now in zip(manifest.entries, scanned, strict=True):
        assert entry.same_stat(now) and entry.ctime_ns == now.ctime_ns, entry.path
        assert entry.target == now.target, entry.path
        path = staged / entry.path
        st_staged = os.lstat(path)
        assert stat.S_IFMT(st_staged.st_mode) == stat.S_IFMT(os.lstat(source / entry.path)
                                                              .st_mode), entry.path
        if entry.type == "file":
            assert entry.hash == hash_file(source / entry.path), entry.path
            assert entry.xattrs == xattrs.digest(os.fspath(source / entry.path)), entry.path
            if entry.path != "config.json":  # (written with a read-only root)
                assert path.read_bytes() == (source / entry.path).read_bytes(), entry.path
                assert stat.S_IMODE(st_staged.st_mode) == entry.mode, entry.path
                assert st_staged.st_nlink >= 2, entry.path  # the pool's entry
        elif entry.type == "dir":
            assert stat.S_IMODE(st_staged.st_mode) == entry.mode, entry.path
            assert st_staged.st_mtime_ns == entry.mtime_ns, entry.path
        elif entry.type == "symlink":
            assert os.readlink(path) == entry.target, entry.path
    marker = read_marker(staged)
    assert marker is not None and marker.tree == stat_digest(source)
    assert marker.files == sum(1 for e in scanned if e.type == "file")


def _pool_is_clean(to: Path) -> None:
    for entry in (to / ".ocistage-pool").rglob("*"):
        if entry.is_file():
            assert entry.stat().st_nlink >= 2, entry  # linked by the staged version


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000),
       changes=st.lists(st.sampled_from(CHANGES), min_size=1, max_size=6))
def test_a_one_pass_re_stage_stages_the_source_as_it_is(
        tmp_path_factory: pytest.TempPathFactory, other_fs: Path, one_pass: list[bool],
        seed: int, changes: list[str]) -> None:
    root = tmp_path_factory.mktemp("restage")
    source = _source(root / "src")
    to = other_fs / root.name
    cache = root / "cache"
    holder = Holder.pin("test")
    stage_directory(source, to, cache_root=cache, name="x", holder=holder)
    rng = random.Random(seed)
    for how in changes:
        _change(source, how, rng)
    before = len(one_pass)
    result = stage_directory(source, to, cache_root=cache, name="x", holder=holder)
    settle(cache)
    if stat_digest(source) != read_marker(to / "x").tree:  # pragma: no cover (a bug)
        pytest.fail("the marker's digest is not the source's")
    assert one_pass[before:] in ([True], [])  # ([]: the change changed nothing it sees)
    assert result.path == to / "x" and result.method == "pool"
    _check(source, to / "x")
    _pool_is_clean(to)
    again = stage_directory(source, to, cache_root=cache, name="x", holder=holder)
    assert again.unchanged == again.files == result.files


def test_a_previous_json_manifest_takes_the_general_way_once(
        tmp_path: Path, other_fs: Path, one_pass: list[bool]) -> None:
    """A version staged by an ocistage that wrote JSON manifests: its re-stage goes the
    general way (which reads JSON), the next one the one-pass way."""
    source = _source(tmp_path / "src")
    cache = tmp_path / "cache"
    holder = Holder.pin("test")
    stage_directory(source, other_fs, cache_root=cache, name="x", holder=holder)
    manifest_path = other_fs / "x" / MANIFEST_NAME
    manifest = Manifest.from_bytes(manifest_path.read_bytes())
    manifest_path.unlink()
    manifest_path.write_bytes(b"".join(manifest.json_chunks()))
    (source / "d1" / "e2" / "f3").write_bytes(b"changed once\n")
    first = stage_directory(source, other_fs, cache_root=cache, name="x", holder=holder)
    (source / "d2" / "e0" / "f1").write_bytes(b"changed twice\n")
    second = stage_directory(source, other_fs, cache_root=cache, name="x", holder=holder)
    assert one_pass == [False, True]
    assert (first.copied, second.copied) == (1, 1)
    assert second.unchanged == second.files - 1
    settle(cache)
    _check(source, other_fs / "x")


_STAGER: list[int] = []


def _forgetful(job: restage.PlaceJob, subtrees: dict[int, list[Record]],
               *args: Any) -> restage.Placed:
    """:func:`restage.place_subtrees`, forgetting in a worker what it walked (it is pickled by
    name, so it is the module's)."""
    return _real_place_subtrees(job, subtrees if os.getpid() == _STAGER[-1] else {}, *args)


def test_subtrees_a_worker_walked_are_placed_by_whoever_is_free(
        tmp_path: Path, other_fs: Path, one_pass: list[bool],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's second step forgets the subtrees it walked: each is then claimed, walked
    again and placed by the stager or by that worker, and the version is the source's."""
    _STAGER.append(os.getpid())
    source = _source(tmp_path / "src")
    cache = tmp_path / "cache"
    holder = Holder.pin("test")
    stage_directory(source, other_fs, cache_root=cache, name="x", holder=holder)
    monkeypatch.setattr(restage, "place_subtrees", _forgetful)
    for n in range(4):
        (source / f"d{n}" / "e1" / "f2").write_bytes(b"changed %d\n" % n)
    result = stage_directory(source, other_fs, cache_root=cache, name="x", holder=holder)
    assert one_pass == [True]
    assert result.copied == 4 and result.unchanged == result.files - 4
    settle(cache)
    _check(source, other_fs / "x")
