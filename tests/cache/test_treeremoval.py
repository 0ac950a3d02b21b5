"""Removal through descriptors: iterative, indifferent to depth and PATH_MAX, never following a
link (also one swapped in between two steps), and touching only the caller's entries where
others can write."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ocistage.cache import treewalk
from ocistage.cache.errors import StoreError, UntrustedPath
from ocistage.cache.treeremoval import remove_at, remove_tree
from ocistage.cache.treewalk import path_stats
from tests.cache.deeptree import make_chain

NOBODY = 65534
needs_root = pytest.mark.needs_root("a second user needs root and setpriv")


def as_nobody(*argv: str) -> None:
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                    *argv], check=True)


@pytest.mark.parametrize(("depth", "name_length"), [(400, 8), (17, 250), (1500, 1)])
def test_deep_and_long_trees_are_measured_and_removed(tmp_path: Path, depth: int,
                                                      name_length: int) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    entries = make_chain(tree, depth, name_length)
    if name_length == 250:
        assert depth * (name_length + 1) > os.pathconf(tmp_path, "PC_PATH_MAX")
    stats = list(path_stats(tree))
    assert len(stats) == entries + 1
    assert sum(st.st_size for st in stats if stat.S_ISREG(st.st_mode)) == 10 * depth
    remove_tree(tree)
    assert not tree.exists()


def test_read_only_and_mode_000_directories_are_removed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    tree = tmp_path / "tree"
    (tree / "ro/sub").mkdir(parents=True)
    (tree / "ro/sub/f").write_text("x")
    (tree / "zero").mkdir()
    (tree / "zero/f").write_text("x")
    (tree / "link").symlink_to(outside)
    (tree / "filelink").symlink_to(outside / "keep")
    os.chmod(tree / "ro/sub", 0o555)
    os.chmod(tree / "ro", 0o555)
    os.chmod(tree / "zero", 0)
    remove_tree(tree)
    assert not tree.exists()
    assert (outside / "keep").read_text() == "x"


def test_a_symlink_given_as_the_tree_is_only_unlinked(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "outside")
    remove_tree(tmp_path / "link")
    remove_tree(tmp_path / "missing")
    assert not (tmp_path / "link").is_symlink()
    assert (tmp_path / "outside" / "keep").read_text() == "x"


def swap_for_link(parent_fd: int, name: str, target: Path) -> None:
    """What an attacker does between two steps: move directory ``name`` out of the tree and
    put a symlink to ``target`` in its place."""
    os.rename(name, target.parent / f"moved-{name}", src_dir_fd=parent_fd)
    os.symlink(target, name, dir_fd=parent_fd)


def victim_tree(tmp_path: Path) -> tuple[Path, Path]:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep").write_text("k")
    (outside / "sub" / "keep").write_text("k")
    tree = tmp_path / "tree"
    (tree / "a" / "sub").mkdir(parents=True)
    (tree / "a" / "f").write_text("f")
    (tree / "a" / "sub" / "f").write_text("f")
    return tree, outside


def before_first_call(monkeypatch: pytest.MonkeyPatch, function: str, name: str,
                      attack: Callable[[int], None]) -> list[str]:
    """Run ``attack(dir_fd)`` just before the first ``os.<function>(name, ..., dir_fd=...)``:
    an attacker winning the race at that system call, whichever code of ours makes it.
    Returns a list that holds ``name`` once the attack has run."""
    real: Callable[..., object] = getattr(os, function)
    attacked: list[str] = []

    def racing(path: object, *args: object, **kwargs: object) -> object:
        dir_fd = kwargs.get("dir_fd")
        if not attacked and path == name and isinstance(dir_fd, int):
            attacked.append(name)
            attack(dir_fd)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, function, racing)
    return attacked


def test_a_directory_swapped_for_a_link_before_it_is_opened_is_only_unlinked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree, outside = victim_tree(tmp_path)
    swapped = before_first_call(monkeypatch, "open", "a",
                                lambda parent_fd: swap_for_link(parent_fd, "a", outside))
    remove_tree(tree)
    assert swapped == ["a"]
    assert not tree.exists()
    assert sorted(p.name for p in outside.rglob("*")) == ["keep", "keep", "sub"]
    assert (tmp_path / "moved-a" / "sub" / "f").exists()  # moved out: no longer ours to remove


def test_a_directory_swapped_for_a_link_before_its_rmdir_is_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree, outside = victim_tree(tmp_path)
    swapped = before_first_call(monkeypatch, "rmdir", "sub",
                                lambda parent_fd: swap_for_link(parent_fd, "sub", outside))
    with pytest.raises(OSError):  # tree/a still holds what was swapped in: not removed
        remove_tree(tree)
    assert swapped == ["sub"]
    assert (tree / "a" / "sub").is_symlink()  # the link stays: it is not what was emptied
    assert sorted(p.name for p in outside.rglob("*")) == ["keep", "keep", "sub"]
    assert list((tmp_path / "moved-sub").iterdir()) == []  # emptied before it was moved


def test_a_deep_directory_moved_elsewhere_during_the_walk_stops_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below :data:`MAX_OPEN_DIRS` levels the walk re-opens ancestors through ``..``: when a
    directory was moved meanwhile, ``..`` is somewhere else, and the walk stops there."""
    tree = tmp_path / "tree"
    tree.mkdir()
    make_chain(tree, treewalk.MAX_OPEN_DIRS + 10, 2)
    (tmp_path / "keep").write_text("k")
    real_open = os.open

    def move_away(dir_fd: int) -> None:
        """Move the directory the walk is about to leave through ``..`` out of the tree."""
        parent = real_open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)
        try:
            inode = os.fstat(dir_fd).st_ino
            name = next(e.name for e in os.scandir(parent)
                        if e.is_dir(follow_symlinks=False) and e.inode() == inode)
            os.rename(name, tmp_path / "elsewhere", src_dir_fd=parent)
        finally:
            os.close(parent)

    moved = before_first_call(monkeypatch, "open", "..", move_away)
    with pytest.raises(StoreError, match="moved while"):
        remove_tree(tree)
    assert moved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "keep", "tree"]


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A directory other users can reach (pytest's tmp_path is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix="ocistage-treeremoval-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)  # holds another user's entries, which remove_tree leaves


@needs_root
def test_in_a_directory_others_can_write_only_the_callers_entries_go(open_base: Path) -> None:
    """In a sticky shared directory root removes only its own entries; inside its own tree it
    removes everything, also what another user put into a world-writable subdirectory (as
    slurmstepd makes ``rootfs/slurm`` as the job's user): left there, the tree could never go."""
    shared = open_base / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "mine").mkdir()
    (shared / "mine" / "f").write_text("mine")
    os.chmod(shared / "mine", 0o1777)
    as_nobody("mkdir", f"{shared}/mine/theirs")
    as_nobody("touch", f"{shared}/mine/their-file", f"{shared}/mine/theirs/x")
    as_nobody("ln", "-s", "/etc", f"{shared}/mine/theirs/etc-link")
    as_nobody("mkdir", f"{shared}/planted")
    as_nobody("touch", f"{shared}/planted/keep")
    remove_tree(shared / "mine")
    assert not os.path.lexists(shared / "mine")
    assert os.path.isdir("/etc")  # the planted link was unlinked, never followed
    with pytest.raises(UntrustedPath, match="owner uid 65534"):
        remove_tree(shared / "planted")
    assert (shared / "planted" / "keep").exists()


@needs_root
def test_other_owners_inside_a_private_tree_go_with_it(tmp_path: Path) -> None:
    """An image unpacked as root keeps its files' owners; such a tree is removed whole."""
    tree = tmp_path / "tree"
    (tree / "home" / "user").mkdir(parents=True)
    (tree / "home" / "user" / "f").write_text("x")
    for path in (tree / "home" / "user", tree / "home" / "user" / "f"):
        os.chown(path, NOBODY, NOBODY)
    remove_tree(tree)
    assert not tree.exists()


def test_remove_at_refuses_nothing_in_a_private_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        remove_at(fd, "f")
        remove_at(fd, "f")  # missing is fine
    finally:
        os.close(fd)
    assert list(tmp_path.iterdir()) == []


@needs_root
def test_an_unreadable_directory_of_another_user_is_reported_not_opened(
        open_base: Path) -> None:
    shared = open_base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "roots").mkdir(mode=0o700)
    (shared / "roots" / "f").write_text("x")
    repo = Path(__file__).resolve().parents[2]
    code = (f"import sys; sys.path.insert(0, {str(repo)!r}); "
            "from ocistage.cache.errors import UntrustedPath\n"
            "from ocistage.cache.treeremoval import remove_tree\n"
            "try:\n"
            f"    remove_tree({str(shared / 'roots')!r})\n"
            "except UntrustedPath as exc:\n"
            "    print(exc)\n")
    result = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                             "--clear-groups", sys.executable, "-c", code],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "roots (owner uid 0)" in result.stdout
    assert (shared / "roots" / "f").read_text() == "x"
