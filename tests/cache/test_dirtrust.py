"""The trust rule for one directory: the caller's or root's and not writable by others; a
sticky one usable only as a parent; a group-shared cache's setgid directory of the caller's
group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocistage.cache.dirtrust import check_shared_parent, check_trusted_dir
from ocistage.cache.errors import UntrustedPath

NOBODY = 65534


def test_trusted_directories_are_the_callers_or_roots_and_not_writable_by_others(
        tmp_path: Path) -> None:
    fine = tmp_path / "fine"
    fine.mkdir(mode=0o755)
    check_trusted_dir(fine, "test directory")
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(UntrustedPath, match=f"refusing test directory {loose}: it is "
                                            f"writable by every user"):
        check_trusted_dir(loose, "test directory")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    check_shared_parent(sticky, "target")  # like /tmp: usable as a parent
    with pytest.raises(UntrustedPath):
        check_trusted_dir(sticky, "pool")  # never for ocistage's own directories
    (tmp_path / "link").symlink_to(fine)
    with pytest.raises(UntrustedPath, match="symbolic link"):
        check_trusted_dir(tmp_path / "link", "pool")
    check_trusted_dir(tmp_path / "link", "target", follow=True)  # the user's choice


@pytest.mark.needs_root  # chown to another user
def test_a_directory_of_another_user_is_refused_unless_group_shared(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UntrustedPath, match=r"owned by nobody \(uid 65534\), not by you"):
        check_trusted_dir(theirs, "cache")
    group = tmp_path / "group"
    group.mkdir()
    os.chown(group, NOBODY, os.getegid())
    group.chmod(0o2775)  # setgid, group-writable, of the caller's group
    check_trusted_dir(group, "cache", group_shared=True)
    with pytest.raises(UntrustedPath):
        check_trusted_dir(group, "pool")
    group.chmod(0o775)  # not marked as group-shared
    with pytest.raises(UntrustedPath):
        check_trusted_dir(group, "cache", group_shared=True)
