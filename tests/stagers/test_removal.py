"""Removing an old version with forked workers: everything goes, nothing outside is touched."""

from __future__ import annotations

import os
from pathlib import Path

from ocistage.stagers.removal import remove_in_workers, split


def _nested(root: Path, dirs: int = 6, files: int = 5) -> None:
    for a in range(dirs):
        for b in range(dirs):
            leaf = root / f"a{a}" / f"b{b}"
            leaf.mkdir(parents=True)
            for n in range(files):
                (leaf / f"f{n}").write_bytes(b"x" * n)
    (root / "top-file").write_bytes(b"top\n")


def test_a_tree_is_removed_by_several_processes(tmp_path: Path) -> None:
    old = tmp_path / "old"
    _nested(old)
    (old / "a1" / "ro").mkdir()
    (old / "a1" / "ro" / "inside").write_bytes(b"x")
    (old / "a1" / "ro").chmod(0o500)
    (old / "a2" / "b0" / "locked").mkdir()
    (old / "a2" / "b0" / "locked").chmod(0)
    remove_in_workers(os.fspath(old), processes=3)
    assert not old.exists()
    assert os.listdir(tmp_path) == []


def test_symlinks_inside_and_at_the_path_are_unlinked_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"keep me\n")
    old = tmp_path / "old"
    _nested(old)
    os.symlink(outside, old / "a0" / "escape")       # a planted link to a directory
    os.symlink(outside, old / "a3" / "b1" / "deep")
    remove_in_workers(os.fspath(old), processes=2)
    assert not old.exists()
    assert (outside / "keep").read_bytes() == b"keep me\n"
    link = tmp_path / "link"
    os.symlink(outside, link)
    remove_in_workers(os.fspath(link), processes=2)
    assert not os.path.lexists(link) and (outside / "keep").exists()
    remove_in_workers(os.fspath(tmp_path / "missing"), processes=2)  # missing is fine


def test_split_takes_the_first_level_with_enough_directories(tmp_path: Path) -> None:
    _nested(tmp_path / "t", dirs=3)
    os.symlink("a0", tmp_path / "t" / "not-a-dir")
    root_fd = os.open(tmp_path / "t", os.O_RDONLY | os.O_DIRECTORY)
    opened = [root_fd]
    try:
        assert sorted(name for _fd, name in split(root_fd, 2, opened)) == ["a0", "a1", "a2"]
        deeper = split(root_fd, 5, opened)  # 3 at the first level: the next one, 9 leaves
        assert len(deeper) == 9 and len({(fd, name) for fd, name in deeper}) == 9
        for fd, name in deeper:
            assert os.path.isdir(f"/proc/self/fd/{fd}/{name}") and name.startswith("b")
        # no directories below the leaves: the level above stays the split
        assert len(split(root_fd, 1000, opened)) == 9
    finally:
        for fd in opened:
            os.close(fd)
