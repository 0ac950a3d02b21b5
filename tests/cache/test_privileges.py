"""ocistage.cache.privileges: strip_privileges takes setuid/setgid bits and file capabilities
from every regular file of a tree (any depth, hard links, no symlink followed), removes device
nodes when asked, and counts what it took; privatedirs.make_private closes a directory of ours."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from ocistage.cache.notice import Kind
from ocistage.cache.privatedirs import make_private
from ocistage.cache.privileges import CAPABILITY_XATTR, strip_privileges, stripped_warning

#: vfs_cap_data revision 2, effective, permitted = cap_dac_read_search
CAP = bytes([1, 0, 0, 2, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
needs_root = pytest.mark.needs_root("setting file capabilities needs root")


def _file(path: Path, mode: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"#!/bin/sh\n")
    path.chmod(mode)
    return path


def _has_capability(path: Path) -> bool:
    try:
        os.getxattr(path, CAPABILITY_XATTR, follow_symlinks=False)
    except OSError as exc:
        assert exc.errno == errno.ENODATA
        return False
    return True


def test_setid_bits_go_at_any_depth_and_through_hard_links(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    deep = tree.joinpath(*["d"] * 50)
    su = _file(deep / "su", 0o4755)
    sg = _file(tree / "sg", 0o2711)
    both = _file(tree / "x" / "both", 0o6750)
    plain = _file(tree / "plain", 0o755)
    sticky = _file(tree / "sticky", 0o1755)  # not a privilege: left as it is
    outside = _file(tmp_path / "outside", 0o4755)
    os.link(su, tmp_path / "su-link")  # the same inode outside the tree
    (tree / "to-outside").symlink_to(outside)  # never followed
    assert strip_privileges(tree) == 3
    assert stat.S_IMODE(su.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "su-link").stat().st_mode) == 0o755
    assert stat.S_IMODE(sg.stat().st_mode) == 0o711
    assert stat.S_IMODE(both.stat().st_mode) == 0o750
    assert stat.S_IMODE(plain.stat().st_mode) == 0o755
    assert stat.S_IMODE(sticky.stat().st_mode) == 0o1755
    assert stat.S_IMODE(outside.stat().st_mode) == 0o4755
    assert strip_privileges(tree) == 0  # nothing left to take


@needs_root
def test_file_capabilities_go_and_devices_only_when_asked(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    reader = _file(tree / "bin" / "reader", 0o755)
    os.setxattr(reader, CAPABILITY_XATTR, CAP)
    os.setxattr(reader, "user.kept", b"1")
    os.mknod(tree / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert strip_privileges(tree) == 1
    assert not _has_capability(reader)
    assert os.getxattr(reader, "user.kept") == b"1"
    assert (tree / "null").exists()
    assert strip_privileges(tree, devices=True) == 0
    assert not os.path.lexists(tree / "null")


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens every directory")
def test_an_unreadable_directory_of_ours_is_entered(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    su = _file(tree / "locked" / "su", 0o4755)
    (tree / "locked").chmod(0o000)
    try:
        assert strip_privileges(tree) == 1
    finally:
        (tree / "locked").chmod(0o755)
    assert stat.S_IMODE(su.stat().st_mode) == 0o755


def test_the_warning_counts_and_is_silent_for_none() -> None:
    assert stripped_warning(0, "x") == ()
    [notice] = stripped_warning(2, "the cache is group-shared")
    assert notice.kind == Kind.PRIVILEGES
    assert str(notice).startswith("2 file(s) of the image lost their setuid/setgid bits")


def test_make_private_closes_our_directory_and_never_follows_a_link(tmp_path: Path) -> None:
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o755)
    ours.chmod(0o2775)
    make_private(ours)
    assert stat.S_IMODE(ours.stat().st_mode) == 0o700
    target = tmp_path / "target"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(OSError):
        make_private(tmp_path / "link")
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
