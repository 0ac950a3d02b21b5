"""ocistage.stagers.statwalk: the parallel stat walk gives the sequential walk's digest and records,
in
the same order, whatever the shape of the tree."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocistage.stagers.errors import StageError
from ocistage.stagers.filemanifest import Record, walk_digest
from ocistage.stagers.statwalk import MIN_PARALLEL_DIRS, _expand, parallel_walk_digest


def _tree(root: Path, seed: int, dirs: int, depth: int) -> Path:
    """A seeded tree: nested directories (some empty, some deep), files, symlinks, a FIFO,
    names that sort in surprising ways or are no UTF-8, the reserved names at the top."""
    rng = random.Random(seed)
    root.mkdir()
    made = [root]
    for n in range(dirs):
        parent = rng.choice(made)
        if len(parent.relative_to(root).parts) >= depth:
            parent = root
        child = parent / rng.choice([f"d{n}", f"D{n}", f"d{n}.x", f"é{n}", f"{n:03d}"])
        child.mkdir(exist_ok=True)
        made.append(child)
        for m in range(rng.randrange(4)):
            (child / f"f{m}").write_bytes(os.urandom(rng.randrange(64)))
        if rng.random() < 0.2:
            os.symlink(f"../target{n}", child / "link")
        if rng.random() < 0.1:  # not UTF-8, a newline: records must come back exactly
            (child / os.fsdecode(b"raw\xff\nname")).write_bytes(b"")
    os.mkfifo(root / made[-1].relative_to(root) / "fifo")
    (root / "config.json").write_text("{}")
    (root / ".ocistage-manifest.json").write_text("{}")  # reserved at the top: skipped
    return root


@pytest.mark.parametrize("processes", [2, 3, 4])
def test_parallel_walk_equals_the_sequential_walk(tmp_path: Path, processes: int) -> None:
    root = _tree(tmp_path / "tree", seed=processes, dirs=300, depth=6)
    expected: list[Record] = []
    digest = walk_digest(root, expected)
    assert sum(1 for p in _expand(os.fspath(root), 64) if not isinstance(p, list)) \
        >= MIN_PARALLEL_DIRS  # the parallel path is taken
    walked = parallel_walk_digest(root, processes)
    assert walked.digest == digest
    assert walked.records() == expected


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), dirs=st.integers(0, 120), depth=st.integers(1, 5),
       processes=st.integers(1, 4))
def test_any_tree_walks_the_same(tmp_path_factory: pytest.TempPathFactory, seed: int,
                                 dirs: int, depth: int, processes: int) -> None:
    root = _tree(tmp_path_factory.mktemp("walk") / "tree", seed, dirs, depth)
    expected: list[Record] = []
    digest = walk_digest(root, expected)
    walked = parallel_walk_digest(root, processes)
    assert walked.digest == digest
    assert walked.records() == expected


def test_a_subtree_a_worker_cannot_read_is_a_stage_error(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory that cannot be listed (EACCES, or gone) deep in a worker's subtree: the
    worker's OSError comes back as the stage's error (root reads everything, so the listing
    fails by a patch that the forked workers inherit: of the listing step their walk takes,
    ocistage.stagers.filemanifest.children)."""
    from ocistage.stagers import filemanifest

    root = _tree(tmp_path / "tree", seed=1, dirs=300, depth=6)
    real = filemanifest.children

    def refusing(directory: str, prefix: str, ctime: bool = True,
                 ) -> tuple[list[Record], list[tuple[str, str]]]:
        if prefix.count("/") >= 4:
            raise PermissionError(13, "Permission denied", directory)
        return real(directory, prefix, ctime)

    monkeypatch.setattr(filemanifest, "children", refusing)
    with pytest.raises(StageError, match=r"cannot read the source tree .*Permission denied"):
        parallel_walk_digest(root, 2)


def test_a_level_wider_than_a_task_queue_is_not_taken(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A top whose next level would hand out more subtrees than the task queue holds stops
    expanding before it; the walk stays the sequential one's."""
    from ocistage.stagers import statwalk

    root = tmp_path / "tree"
    for n in range(40):
        (root / "wide" / f"d{n:02d}" / "sub").mkdir(parents=True)
    monkeypatch.setattr(statwalk, "MAX_QUEUE", 30)
    pieces = _expand(os.fspath(root), 1000)
    assert sum(1 for p in pieces if not isinstance(p, list)) == 1  # "wide" only: 40 > 30
    expected: list[Record] = []
    digest = walk_digest(root, expected)
    walked = parallel_walk_digest(root, 2)
    assert walked.digest == digest and walked.records() == expected


def test_a_bundle_that_fans_out_deep_is_still_split(tmp_path: Path) -> None:
    """rootfs/usr/... : the fan-out starts three levels down, as in a bundle of /usr."""
    root = tmp_path / "bundle"
    for a in range(6):
        for b in range(6):
            (root / "rootfs" / "usr" / f"p{a}" / f"q{b}").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    pieces = _expand(os.fspath(root), 32)
    assert sum(1 for p in pieces if not isinstance(p, list)) >= MIN_PARALLEL_DIRS
    expected: list[Record] = []
    digest = walk_digest(root, expected)
    walked = parallel_walk_digest(root, 2)
    assert walked.digest == digest and walked.records() == expected
