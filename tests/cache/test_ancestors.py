"""Every ancestor of a path handed to another program or staged into (``walk_trusted``,
``check_path_trusted``; docs/trust.md "Every directory above"): the StrictModes rule, walked
through descriptors from ``/``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocistage.cache.ancestors import MAX_SYMLINKS, check_path_trusted, walk_trusted
from ocistage.cache.errors import StoreError, UntrustedPath

NOBODY = 65534
needs_root = pytest.mark.needs_root("a second user needs root and setpriv")


def _dir(path: Path, mode: int, uid: int | None = None) -> Path:
    path.mkdir(parents=True)
    path.chmod(mode)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def test_a_trusted_path_is_accepted_and_what_is_missing_made(tmp_path: Path) -> None:
    check_path_trusted(tmp_path, "x")
    target = tmp_path / "a" / "b" / "c"
    with pytest.raises(StoreError, match="cannot examine x"):
        check_path_trusted(target, "x")  # missing, nothing asked to be made
    os.umask(umask := os.umask(0o022))
    check_path_trusted(target, "x", make=0o700)
    assert target.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o755 & ~umask
    check_path_trusted(tmp_path / "a" / "." / "b" / ".." / "b" / "c", "x")


def test_an_ancestor_others_can_write_is_refused_and_nothing_made_in_it(
        tmp_path: Path) -> None:
    loose = _dir(tmp_path / "loose", 0o777)
    (loose / "mine").mkdir()
    with pytest.raises(UntrustedPath, match=f"its directory {loose} is writable by every"):
        check_path_trusted(loose / "mine", "stage target")
    with pytest.raises(UntrustedPath) as caught:
        check_path_trusted(loose / "new" / "deeper", "stage target", make=0o755)
    assert not (loose / "new").exists()
    assert caught.value.hint is not None and "every directory" in caught.value.hint


@pytest.mark.needs_root("chown to a group the caller is not in")
def test_an_ancestor_a_group_can_write_is_refused(tmp_path: Path) -> None:
    group = _dir(tmp_path / "group", 0o775)
    os.chown(group, -1, 12345)  # a group that is nobody's user-private group
    (group / "x").mkdir()
    with pytest.raises(UntrustedPath, match="writable by group"):
        check_path_trusted(group / "x", "x")


def test_the_path_itself_must_be_trusted_or_with_shared_a_sticky_one_of_ours(
        tmp_path: Path) -> None:
    sticky = _dir(tmp_path / "sticky", 0o1777)
    with pytest.raises(UntrustedPath, match="writable by every user"):
        check_path_trusted(sticky, "x")
    check_path_trusted(sticky, "x", shared=True)
    loose = _dir(tmp_path / "loose", 0o777)
    with pytest.raises(UntrustedPath, match="writable by every user"):
        check_path_trusted(loose, "x", shared=True)


@needs_root
def test_in_a_sticky_directory_only_the_callers_or_roots_entries_lead_on(
        tmp_path: Path) -> None:
    sticky = _dir(tmp_path / "sticky", 0o1777)
    _dir(sticky / "mine" / "deeper", 0o755)
    check_path_trusted(sticky / "mine" / "deeper", "x")
    theirs = _dir(sticky / "theirs", 0o755, NOBODY)
    (theirs / "deeper").mkdir()
    with pytest.raises(UntrustedPath, match=rf"{theirs} in the sticky directory {sticky} is "
                                            r"owned by .*uid 65534"):
        check_path_trusted(theirs / "deeper", "x")
    with pytest.raises(UntrustedPath):
        check_path_trusted(theirs, "x")  # the last component too: it could be swapped
    # a link a co-tenant planted, even to a directory of ours
    (sticky / "link").symlink_to(sticky / "mine")
    os.chown(sticky / "link", NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(UntrustedPath, match=r"link in the sticky directory"):
        check_path_trusted(sticky / "link" / "deeper", "x")
    # a name a co-tenant took first is not made ours by `make`
    with pytest.raises(UntrustedPath):
        check_path_trusted(theirs, "x", make=0o700)


@needs_root
def test_a_sticky_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = _dir(tmp_path / "theirs", 0o1777, NOBODY)
    _dir(theirs / "mine", 0o755)
    with pytest.raises(UntrustedPath, match=rf"its directory {theirs} is owned by"):
        check_path_trusted(theirs / "mine", "x")
    private = _dir(tmp_path / "private", 0o755, NOBODY)
    _dir(private / "mine", 0o755)
    with pytest.raises(UntrustedPath, match=rf"its directory {private} is owned by"):
        check_path_trusted(private / "mine", "x")


def test_links_in_checked_directories_are_followed_and_their_targets_walked(
        tmp_path: Path) -> None:
    real = _dir(tmp_path / "real" / "sub", 0o755)
    (tmp_path / "abs").symlink_to(real)
    (tmp_path / "rel").symlink_to("real/sub/..")
    (tmp_path / "chain").symlink_to("rel/sub")
    for path in (tmp_path / "abs", tmp_path / "rel" / "sub", tmp_path / "chain"):
        assert walk_trusted(path, "x").st_ino == real.stat().st_ino
    # made through a dangling link: where it leads
    (tmp_path / "dangling").symlink_to(tmp_path / "real" / "new")
    check_path_trusted(tmp_path / "dangling" / "leaf", "x", make=0o700)
    assert (tmp_path / "real" / "new" / "leaf").is_dir()
    # the last component is not followed when asked not to
    with pytest.raises(UntrustedPath, match="is a symbolic link"):
        check_path_trusted(tmp_path / "abs", "x", follow=False)
    # a link leading through a directory others can write is refused there
    loose = _dir(tmp_path / "loose", 0o777)
    _dir(loose / "in", 0o755)
    (tmp_path / "via").symlink_to(loose / "in")
    with pytest.raises(UntrustedPath, match=f"its directory {loose}"):
        check_path_trusted(tmp_path / "via", "x")


def test_link_loops_end(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(StoreError, match="Too many levels of symbolic links"):
        check_path_trusted(tmp_path / "a", "x")
    chain = tmp_path / "c0"
    _dir(chain, 0o755)
    for n in range(1, MAX_SYMLINKS + 2):
        (tmp_path / f"c{n}").symlink_to(f"c{n - 1}")
    check_path_trusted(tmp_path / f"c{MAX_SYMLINKS}", "x")
    with pytest.raises(StoreError, match="Too many levels"):
        check_path_trusted(tmp_path / f"c{MAX_SYMLINKS + 1}", "x")


def test_a_file_on_the_way_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreError, match="Not a directory"):
        check_path_trusted(tmp_path / "f" / "below", "x", make=0o755)
    with pytest.raises(UntrustedPath, match="is not a directory"):
        check_path_trusted(tmp_path / "f", "x")
