"""bench/filesystems.py: what a directory's filesystem is, and the journaled ext4 that
``python -m bench goals`` measures the importer's cold get on (made for real, as root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.filesystems import (
    NoFilesystem,
    describe,
    has_journal,
    journaled_ext4,
    mount_of,
    why_no_journaled_ext4,
)
from pytest_ocistage.components import require_root


def test_the_mount_holding_a_path_is_the_longest_above_it(tmp_path: Path) -> None:
    assert mount_of(Path("/proc/self"))[:2] == ("/proc", "proc")
    point, _kind, _source = mount_of(tmp_path)
    assert os.path.realpath(tmp_path).startswith(point)
    assert describe(Path("/proc")) == "proc"


def test_dev_shm_is_a_tmpfs() -> None:
    if not os.path.ismount("/dev/shm"):
        pytest.skip("no /dev/shm mount here")
    assert describe(Path("/dev/shm")) == "tmpfs"


def test_a_device_jbd2_does_not_list_has_no_journal() -> None:
    assert not has_journal("/dev/no-such-device-here")


def test_a_journaled_ext4_is_made_and_taken_away(tmp_path: Path) -> None:
    require_root()  # mkfs and a loop mount
    why = why_no_journaled_ext4()
    if why is not None:
        pytest.skip(why)
    with journaled_ext4(tmp_path, "64M") as ext4:
        assert os.path.ismount(ext4)
        assert describe(ext4) == "ext4"  # jbd2 lists its loop device: it has a journal
        assert os.stat(ext4).st_mode & 0o7777 == 0o1777
        (ext4 / "file").write_bytes(b"x")
    assert not os.path.ismount(ext4)
    assert list(tmp_path.iterdir()) == []


def test_an_ordinary_user_is_told_why_not() -> None:
    if os.geteuid() == 0:
        pytest.skip("the reason an ordinary user is given")
    assert why_no_journaled_ext4() == "making a loop-mounted ext4 needs root"
    with pytest.raises(NoFilesystem), journaled_ext4(Path("/nonexistent")):
        pass
