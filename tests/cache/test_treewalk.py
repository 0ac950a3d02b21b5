"""Walks through descriptors: iterative, indifferent to depth and PATH_MAX, parents first,
never entering a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocistage.cache.treeremoval import remove_tree
from ocistage.cache.treewalk import walk_dirs
from tests.cache.deeptree import make_chain


@pytest.mark.parametrize(("depth", "name_length"), [(400, 8), (17, 250), (1500, 1)])
def test_walk_dirs_lists_deep_and_long_trees_parents_first(tmp_path: Path, depth: int,
                                                           name_length: int) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    make_chain(tree, depth, name_length)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        listed = list(walk_dirs(fd, "tree"))
    finally:
        os.close(fd)
    assert len(listed) == depth + 1
    seen = {""}
    for rel, dirs, others in listed:
        assert rel.rpartition("/")[0] in seen or rel == ""  # its parent came first
        seen.add(rel)
        assert others == ["f"] or (not dirs and others == [])
    longest = sum(len(f"d{level}".ljust(name_length, "x")) + 1 for level in range(depth)) - 1
    assert max(len(rel) for rel, _, _ in listed) == longest
    remove_tree(tree)  # pytest's own clean-up of old temporary dirs recurses per level


def test_walk_dirs_lists_a_link_to_a_directory_without_entering_it(tmp_path: Path) -> None:
    (tmp_path / "outside" / "secret").mkdir(parents=True)
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "escape").symlink_to(tmp_path / "outside")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        listed = list(walk_dirs(fd, "tree"))
    finally:
        os.close(fd)
    assert listed == [("", ["sub"], []), ("sub", [], ["escape"])]
