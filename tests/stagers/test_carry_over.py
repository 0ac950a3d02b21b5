"""A re-stage through the pool carries unchanged files over in
:meth:`ocistage.stagers.placers.PoolPlacer.place_part` (a ``link()`` and an ``lstat`` of what
was linked), and only when the checks of :meth:`PoolPlacer._pool_entry_ok` hold; whatever
was done to the pool entries or to the previous version's files meanwhile, the new version
holds the source's content and modes, and links the pool entry wherever that entry is the
verified one."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ocistage.cache.leases import Holder
from ocistage.stagers import builder
from ocistage.stagers.directory import stage_directory
from tests.removers import settle

FILES = 12
#: what is done to one file's staged copy before the re-stage: nothing; its pool entry
#: removed, replaced by another inode of the same content, by other bytes of the same size,
#: by a symlink, or given another mode; the previous version's file replaced by a copy (another
#: inode) or removed
DAMAGES = ("none", "pool-missing", "pool-copy", "pool-other-bytes", "pool-symlink",
           "pool-mode", "old-copy", "old-missing")


@pytest.fixture(params=["place_part", "one_pass"])
def forked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Place files through ``Placer.place_part`` in forked workers even for a small tree (the
    path of trees of thousands of files), or (``one_pass``) by the walk's workers
    (:mod:`ocistage.stagers.restage`: the path of a changed tree of thousands of files).
    Returns what the ``one_pass`` fixture records (empty for ``place_part``)."""
    monkeypatch.setattr(builder, "FORK_MIN_FILES", 2)
    if request.param == "one_pass":
        used: list[bool] = request.getfixturevalue("one_pass")
        return used
    return []


def _source(root: Path) -> Path:
    tree = root / "src"
    (tree / "a").mkdir(parents=True)
    (tree / "b").mkdir()
    for n in range(FILES):
        path = tree / ("a" if n % 2 else "b") / f"f{n}"
        path.write_bytes(f"content {n}\n".encode() * (n + 3))
        path.chmod(0o644 if n % 3 else 0o755)
    return tree


def _pool_entry(pool: Path, staged_file: Path) -> Path:
    ino = os.lstat(staged_file).st_ino
    return next(p for p in pool.rglob("*") if p.is_file() and os.lstat(p).st_ino == ino)


def _damage(how: str, pooled: Path, old: Path) -> None:
    if how == "pool-missing":
        pooled.unlink()
    elif how == "pool-copy":  # the same bytes and mode, another inode
        shutil.copy2(pooled, f"{pooled}.new")
        os.replace(f"{pooled}.new", pooled)
    elif how == "pool-other-bytes":
        size = pooled.stat().st_size
        mode = stat.S_IMODE(pooled.stat().st_mode)
        pooled.unlink()
        pooled.write_bytes(b"x" * size)
        pooled.chmod(mode)
    elif how == "pool-symlink":
        pooled.unlink()
        os.symlink(old, pooled)
    elif how == "pool-mode":  # the inode of the previous version's file too
        pooled.chmod(0o600)
    elif how == "old-copy":
        shutil.copy2(old, f"{old}.new")
        os.replace(f"{old}.new", old)
    elif how == "old-missing":
        old.unlink()


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damages=st.lists(st.sampled_from(DAMAGES), min_size=FILES, max_size=FILES))
def test_carried_over_files_are_the_sources(tmp_path_factory: pytest.TempPathFactory,
                                            other_fs: Path, forked: list[bool],
                                            damages: list[str]) -> None:
    root = tmp_path_factory.mktemp("carry")
    source = _source(root)
    to = other_fs / root.name
    cache = root / "cache"
    holder = Holder.pin("test")
    first = stage_directory(source, to, cache_root=cache, name="x", holder=holder)
    assert first.method == "pool"
    pool = to / ".ocistage-pool"
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    for rel, how in zip(files, damages, strict=True):
        _damage(how, _pool_entry(pool, to / "x" / rel), to / "x" / rel)
    changed = source / "b" / "f0"  # something changed: the tree is built again
    changed.write_bytes(b"a new version\n")

    result = stage_directory(source, to, cache_root=cache, name="x", holder=holder)
    settle(cache)  # the replaced version's remover, before the target goes

    for rel, how in zip(files, damages, strict=True):
        staged = to / "x" / rel
        assert staged.read_bytes() == (source / rel).read_bytes(), (rel, how)
        st_staged, st_source = os.lstat(staged), os.lstat(source / rel)
        assert stat.S_ISREG(st_staged.st_mode)
        assert stat.S_IMODE(st_staged.st_mode) == stat.S_IMODE(st_source.st_mode), (rel, how)
        if how in ("none", "old-copy", "pool-copy") and source / rel != changed:
            # the verified pool entry (by identity with the previous version's file, or
            # by its content) is linked, not copied
            assert st_staged.st_nlink >= 2, (rel, how)
    intact = sum(1 for rel, how in zip(files, damages, strict=True)
                 if how == "none" and source / rel != changed)
    assert result.unchanged >= intact
    assert all(forked)  # (one_pass: that way was taken)


def test_a_re_stage_links_unchanged_files_from_the_pool(tmp_path: Path, other_fs: Path,
                                                        forked: list[bool]) -> None:
    """Undamaged: every unchanged file of the new version is its pool entry's inode, as in
    the previous version, and only the changed file is copied."""
    source = _source(tmp_path)
    to = other_fs / "t"
    holder = Holder.pin("test")
    stage_directory(source, to, cache_root=tmp_path / "cache", name="x", holder=holder)
    before = {p.relative_to(to / "x"): os.lstat(p).st_ino
              for p in (to / "x").rglob("*") if p.is_file() and p.parent != to / "x"}
    (source / "a" / "f1").write_bytes(b"changed\n")
    result = stage_directory(source, to, cache_root=tmp_path / "cache", name="x",
                             holder=holder)
    settle(tmp_path / "cache")
    assert (result.copied, result.unchanged) == (1, FILES - 1)
    assert all(forked)
    for rel, ino in before.items():
        now = os.lstat(to / "x" / rel).st_ino
        assert (now == ino) == (rel != Path("a/f1")), rel


SWAPS = ("symlink", "fifo", "other-bytes")


def _swap(how: str, pooled: Path, elsewhere: Path) -> None:
    """Put something else where the pool entry ``pooled`` was, of the same name."""
    size, mode = pooled.stat().st_size, stat.S_IMODE(pooled.stat().st_mode)
    pooled.unlink()
    if how == "symlink":
        os.symlink(elsewhere, pooled)
    elif how == "fifo":
        os.mkfifo(pooled, mode)
    else:  # other bytes of the same size and mode, another inode
        pooled.write_bytes(b"x" * size)
        pooled.chmod(mode)


@pytest.mark.parametrize("how", SWAPS)
def test_a_pool_entry_swapped_as_it_is_linked_is_not_staged(
        tmp_path: Path, other_fs: Path, forked: list[bool], monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    """The pool entry of every unchanged file is swapped for a symlink, a FIFO or other
    bytes just before ``place_part`` links it (after any check made before the link): what
    was linked is checked in the scratch dir, and the swapped entry is not staged."""
    monkeypatch.setattr(builder, "usable_cpus", lambda: 2)  # place_part, in forked workers
    source = _source(tmp_path)
    to = other_fs / "t"
    holder = Holder.pin("test")
    stage_directory(source, to, cache_root=tmp_path / "cache", name="x", holder=holder)
    pool = to / ".ocistage-pool"
    real_link = os.link
    swapped: set[str] = set()

    def swapping_link(src: str, dst: str, *, src_dir_fd: int | None = None,
                      dst_dir_fd: int | None = None, follow_symlinks: bool = True) -> None:
        pooled = pool / src
        if (src_dir_fd is not None and src not in swapped and not os.path.isabs(src)
                and pooled.parent.parent == pool and pooled.is_file()):
            swapped.add(src)
            _swap(how, pooled, source / "a" / "f1")
        real_link(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd,
                  follow_symlinks=follow_symlinks)

    (source / "a" / "f1").write_bytes(b"changed\n")
    monkeypatch.setattr(os, "link", swapping_link)
    stage_directory(source, to, cache_root=tmp_path / "cache", name="x", holder=holder)
    used = list(forked)
    monkeypatch.undo()
    settle(tmp_path / "cache")
    assert all(used)

    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    for rel in files:
        staged = to / "x" / rel
        st_staged, st_source = os.lstat(staged), os.lstat(source / rel)
        assert stat.S_ISREG(st_staged.st_mode), rel
        assert stat.S_IMODE(st_staged.st_mode) == stat.S_IMODE(st_source.st_mode), rel
        assert staged.read_bytes() == (source / rel).read_bytes(), rel
