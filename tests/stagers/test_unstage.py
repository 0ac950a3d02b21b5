"""unstage and the fd-based remover against hostile trees: nothing outside is ever touched."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache import leases
from ocistage.cache import targetlayout as staged_module
from ocistage.cache.leases import Holder
from ocistage.cache.treeremoval import remove_opened, remove_tree
from ocistage.errors import OcistageError
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.filemanifest import MARKER_NAME
from ocistage.stagers.unstage import unstage
from pytest_ocistage.components import require_root


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A directory outside every staged tree whose contents must survive every test."""
    path = tmp_path / "canary"
    (path / "sub").mkdir(parents=True)
    (path / "file").write_text("precious\n")
    (path / "sub" / "deep").write_text("precious too\n")
    (path / "ro").mkdir()
    (path / "ro").chmod(0o555)
    return path


def _intact(canary: Path) -> None:
    assert (canary / "file").read_text() == "precious\n"
    assert (canary / "sub" / "deep").read_text() == "precious too\n"
    assert (canary / "ro").stat().st_mode & 0o777 == 0o555


def _hostile(root: Path, canary: Path) -> None:
    rootfs = root / "rootfs"
    os.symlink(canary, rootfs / "to-canary")
    os.symlink(canary / "file", rootfs / "to-canary-file")
    os.symlink("../../../../../../../../" + str(canary).lstrip("/"), rootfs / "dotdot")
    (rootfs / "locked" / "deeper").mkdir(parents=True)
    (rootfs / "locked" / "deeper" / "f").write_text("x")
    (rootfs / "locked" / "deeper").chmod(0)
    (rootfs / "locked").chmod(0o500)


def test_unstage_removes_hostile_staged_trees(tree: Path, tmp_path: Path, canary: Path) -> None:
    cache = tmp_path / "cache"
    result = stage_directory(tree, tmp_path / "target", cache_root=cache, link=False)
    _hostile(result.path, canary)  # what a job may do to its writable copy (no user's stager
    assert result.path.is_dir()  # reads a source with a mode-000 directory, root's does)
    assert leases.leases_on(cache, f"staged:{result.path}")
    assert unstage(result.path, cache_root=cache) is True
    assert not os.path.lexists(result.path)
    assert leases.leases_on(cache, f"staged:{result.path}") == []
    _intact(canary)
    assert tree.is_dir() and (tree / "rootfs" / "ro").is_dir()  # the source stays


def test_unstage_refuses_a_symlink_in_place_of_the_staged_dir(
        tree: Path, tmp_path: Path, canary: Path) -> None:
    cache = tmp_path / "cache"
    result = stage_directory(tree, tmp_path / "target", cache_root=cache)
    (canary / MARKER_NAME).write_bytes((result.path / MARKER_NAME).read_bytes())
    aside = tmp_path / "aside"
    os.rename(result.path, aside)
    os.symlink(canary, result.path)
    with pytest.raises(OcistageError):
        unstage(result.path, cache_root=cache)
    _intact(canary)
    assert os.path.islink(result.path)


def test_unstage_refuses_what_ocistage_did_not_stage(tmp_path: Path, canary: Path) -> None:
    with pytest.raises(OcistageError, match="not staged by ocistage"):
        unstage(canary, cache_root=tmp_path / "cache")
    _intact(canary)
    (canary / MARKER_NAME).write_text("{not json")
    with pytest.raises(OcistageError):
        unstage(canary, cache_root=tmp_path / "cache")
    _intact(canary)


def test_a_dir_swapped_for_a_symlink_mid_removal_is_not_followed(
        tmp_path: Path, canary: Path) -> None:
    staged = tmp_path / "staged"
    (staged / "a" / "b").mkdir(parents=True)
    (staged / "a" / "b" / "f").write_text("x")
    parent_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fd = os.open(staged, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.rename(staged, tmp_path / "moved")       # the attacker moves the real dir away
        os.symlink(canary, staged)                  # and puts a symlink in its place
        remove_opened(parent_fd, "staged", fd)
    finally:
        os.close(fd)
        os.close(parent_fd)
    assert os.path.islink(staged)                   # left alone
    assert os.listdir(tmp_path / "moved") == []     # what we opened was emptied
    _intact(canary)


def test_racing_symlink_swaps_inside_the_tree_never_escape(tmp_path: Path,
                                                           canary: Path) -> None:
    """An attacker renames the tree's directories and puts symlinks to a canary in their place
    while it is removed: nothing outside is touched, and the tree is removed: by the racing
    removal, or, where a directory gained an entry after it was emptied (ENOTEMPTY, the only
    way to lose the race), by a second removal once the swapper has stopped."""
    swaps = 0
    for round_ in range(20):
        staged = tmp_path / f"staged{round_}"
        for n in range(30):
            (staged / f"d{n}" / "x").mkdir(parents=True)
            (staged / f"d{n}" / "x" / "f").write_text("x")
        stop, started = threading.Event(), threading.Event()
        done: list[int] = []

        def swapper(root: Path = staged, stop: threading.Event = stop,
                    started: threading.Event = started, done: list[int] = done) -> None:
            n = swapped = 0
            while not stop.is_set() and n < 500:  # bounded: each swap adds two entries
                victim = root / f"d{n % 30}"
                try:
                    os.rename(victim, root / f"gone{n}")
                    os.symlink(canary, victim)
                    swapped += 1
                except FileNotFoundError:
                    pass  # the removal got there first: the race this test is about
                started.set()
                n += 1
            done.append(swapped)

        thread = threading.Thread(target=swapper)
        thread.start()
        assert started.wait(10)
        try:
            remove_tree(staged)
        except OSError as error:
            assert error.errno == errno.ENOTEMPTY, error
        finally:
            stop.set()
            thread.join()
        swaps += done[0]
        _intact(canary)
        remove_tree(staged)  # calm now: must succeed, following none of the symlinks
        assert not os.path.lexists(staged)
        _intact(canary)
    assert swaps > 0, "the swapper never swapped: no race was run"


def test_only_the_holders_lease_is_released_while_others_hold(tree: Path,
                                                               tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = stage_directory(tree, tmp_path / "t", cache_root=cache, holder=Holder.pin("a"))
    second = stage_directory(tree, tmp_path / "t", cache_root=cache, holder=Holder.pin("b"))
    assert first.path == second.path and first.lease_id != second.lease_id
    assert unstage(first.path, cache_root=cache, holder=Holder.pin("a")) is False
    assert first.path.is_dir()  # pin b still holds it
    assert [lease.holder.name for lease in leases.leases_on(cache, f"staged:{first.path}")] \
        == ["b"]
    assert unstage(first.path, cache_root=cache, holder=Holder.pin("b")) is True
    assert not first.path.exists()
    assert unstage(first.path, cache_root=cache) is False  # absent: nothing to do


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="ocistage-unstage-"))
    path.chmod(0o755)
    yield path
    remove_tree(path)


def test_an_unprivileged_owner_removes_mode_000_directories(open_dir: Path,
                                                            canary: Path) -> None:
    require_root()  # needs root and setpriv to run the removal as another user
    tmp_path = open_dir
    staged = tmp_path / "userdir" / "staged"
    (staged / "a" / "b").mkdir(parents=True)
    (staged / "a" / "b" / "f").write_text("x")
    (staged / "a" / "secret").write_text("x")
    os.symlink(canary, staged / "a" / "link")
    (staged / "a" / "secret").chmod(0)
    (staged / "a" / "b").chmod(0)
    (staged / "a").chmod(0o500)
    for path in [tmp_path / "userdir", *(tmp_path / "userdir").rglob("*")]:
        os.lchown(path, 65534, 65534)
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[2])!r}); "
            "from ocistage.cache.treeremoval import remove_tree; "
            f"remove_tree({str(staged)!r})")
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert not staged.exists()
    _intact(canary)


@pytest.mark.parametrize("named", ["sibling.txt", "other", "other.sqfs"])
def test_an_edited_marker_never_makes_unstage_delete_a_sibling(tree: Path, tmp_path: Path,
                                                               named: str) -> None:
    """13.11: unstage removed whatever file the marker's `image` named beside the bundle."""
    cache = tmp_path / "cache"
    target = tmp_path / "t"
    staged = stage_directory(tree, target, cache_root=cache, name="mine", holder=Holder.pin("p"))
    other = stage_directory(tree, target, cache_root=cache, name="other",
                            holder=Holder.pin("p"))
    (target / "sibling.txt").write_text("someone's data\n")
    (target / "other.sqfs").write_text("someone's image\n")
    marker = json.loads((staged.path / MARKER_NAME).read_text())
    marker["image"] = named
    (staged.path / MARKER_NAME).write_text(json.dumps(marker))
    assert unstage(staged.path, cache_root=cache, holder=Holder.pin("p"))
    assert (target / "sibling.txt").read_text() == "someone's data\n"
    assert (target / "other.sqfs").read_text() == "someone's image\n"
    assert (other.path / "config.json").exists()


def test_whose_leases_unstage_releases() -> None:
    from ocistage.stagers.markers import default_holder, releasing_holder

    job = {"SLURM_JOB_ID": "77"}
    assert releasing_holder("mine", job) == Holder.pin("mine")
    assert releasing_holder(None, job) == Holder.slurm_job("77")
    assert releasing_holder(None, {}) is None  # outside a job: every holder's
    # staging and unstaging agree on the pin and the job
    assert default_holder("mine", job) == releasing_holder("mine", job)
    assert default_holder(None, job) == releasing_holder(None, job)


def test_a_removal_that_stops_half_way_keeps_the_marker_for_another_try(
        tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Were the marker removed before an entry that cannot be removed (a mount point inside,
    another user's entry), the bundle would stay unmarked, and neither unstage nor GC would
    ever take it again: the marker goes last."""
    cache = tmp_path / "cache"
    staged = stage_directory(tree, tmp_path / "target", cache_root=cache, link=False).path
    real = staged_module.remove_at

    def refusing(dir_fd: int, name: str) -> None:
        if name == "rootfs":
            raise OcistageError("rootfs holds a mount point")
        real(dir_fd, name)

    monkeypatch.setattr(staged_module, "remove_at", refusing)
    with pytest.raises(OcistageError, match="mount point"):
        unstage(staged, cache_root=cache)
    assert (staged / MARKER_NAME).is_file() and (staged / "rootfs").is_dir()
    monkeypatch.undo()
    assert unstage(staged, cache_root=cache)
    assert not os.path.lexists(staged)
