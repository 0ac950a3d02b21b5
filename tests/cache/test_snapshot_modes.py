"""cache/snapshotmodes.py: a snapshot's files stay owner-readable, its record gives a private
copy the image's modes back (issue 34: a user's ``cp -a`` of a ``000`` file of its own)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocistage.cache.errors import StoreError
from ocistage.cache.snapshotmodes import (
    MODES,
    keep_owner_readable,
    read_modes,
    restore_modes,
    write_modes,
)
from ocistage.cache.snapshots import copy_tree, link_tree


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def image_tree(directory: Path) -> Path:
    """``directory/rootfs`` as an unpack leaves it: the image's modes, some files their owner
    may not read."""
    rootfs = directory / "rootfs"
    (rootfs / "etc" / "deep").mkdir(parents=True)
    for name, file_mode in (("etc/shadow", 0o000), ("etc/deep/wronly", 0o200),
                            ("etc/passwd", 0o644), ("etc/suid", 0o4311)):
        (rootfs / name).write_text(name)
        os.chmod(rootfs / name, file_mode)
    os.link(rootfs / "etc/shadow", rootfs / "etc/shadow-link")
    os.symlink("shadow", rootfs / "etc/to-shadow")
    os.mkfifo(rootfs / "etc/fifo", 0o000)
    return rootfs


def test_unreadable_files_become_owner_readable_and_a_copy_gets_the_image_modes(
        tmp_path: Path) -> None:
    rootfs = image_tree(tmp_path / "snap")
    found = keep_owner_readable(rootfs)
    assert found == [("etc/shadow", 0o000), ("etc/shadow-link", 0o000),
                     ("etc/suid", 0o4311), ("etc/deep/wronly", 0o200)]
    assert (mode(rootfs / "etc/shadow"), mode(rootfs / "etc/deep/wronly")) == (0o400, 0o600)
    assert mode(rootfs / "etc/suid") == 0o4711  # the set-id bit kept
    assert mode(rootfs / "etc/fifo") == 0o000  # no file: nothing reads it
    write_modes(rootfs.parent, found or [])
    copy = tmp_path / "copy"
    copy_tree(rootfs, copy)  # as a user too: every file is readable now
    restore_modes(copy, read_modes(rootfs.parent) or [])
    assert (mode(copy / "etc/shadow"), mode(copy / "etc/shadow-link"),
            mode(copy / "etc/deep/wronly"), mode(copy / "etc/suid")) == (0, 0, 0o200, 0o4311)
    assert mode(rootfs / "etc/shadow") == 0o400  # the snapshot is left as it was


def test_a_snapshot_built_on_another_inherits_its_modes(tmp_path: Path) -> None:
    base = image_tree(tmp_path / "base")
    write_modes(base.parent, keep_owner_readable(base) or [])
    upper = tmp_path / "upper" / "rootfs"
    upper.parent.mkdir()
    link_tree(base, upper)
    os.link(upper / "etc/shadow", upper / "etc/again")     # a lower inode, a new name
    os.unlink(upper / "etc/deep/wronly")                   # replaced by a readable file
    (upper / "etc/deep/wronly").write_text("new")
    os.unlink(upper / "etc/shadow-link")                   # deleted
    (upper / "etc/gshadow").write_text("upper")
    os.chmod(upper / "etc/gshadow", 0o000)
    found = dict(keep_owner_readable(upper, base) or [])
    assert found == {"etc/again": 0, "etc/shadow": 0, "etc/gshadow": 0, "etc/suid": 0o4311}
    assert mode(base / "etc/shadow") == 0o400 and mode(upper / "etc/gshadow") == 0o400


def test_on_a_snapshot_without_a_record_nothing_is_changed(tmp_path: Path) -> None:
    base = image_tree(tmp_path / "old")          # made by an older ocistage: image modes
    upper = tmp_path / "upper" / "rootfs"
    upper.parent.mkdir()
    link_tree(base, upper)
    assert keep_owner_readable(upper, base) is None
    assert mode(base / "etc/shadow") == 0 and not (upper.parent / MODES).exists()
    assert read_modes(base.parent) is None


@pytest.mark.parametrize("record", [
    b"not a record\n",
    b"ocistage snapshot modes 1\netc/shadow\x00",
    b"ocistage snapshot modes 1\netc/shadow\x00999\x00",
    b"ocistage snapshot modes 1\n../../etc/passwd\x00644\x00",
    b"ocistage snapshot modes 1\n/etc/passwd\x00644\x00",
    b"ocistage snapshot modes 1\netc//passwd\x00644\x00",
    b"ocistage snapshot modes 1\netc/passwd\x0017777\x00",
])
def test_a_damaged_record_is_refused(tmp_path: Path, record: bytes) -> None:
    (tmp_path / MODES).write_bytes(record)
    with pytest.raises(StoreError, match="damaged"):
        read_modes(tmp_path)


def test_restoring_never_follows_a_link_out_of_the_copy(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "file").write_text("not the bundle's")
    copy = tmp_path / "copy"
    copy.mkdir()
    os.symlink(outside, copy / "etc")
    (copy / "link").symlink_to(outside / "file")
    for rel in ("etc/file", "link"):
        with pytest.raises(StoreError):
            restore_modes(copy, [(rel, 0o000)])
    assert mode(outside / "file") == 0o644


names = st.text(st.characters(blacklist_characters="\x00/", blacklist_categories=("Cs",)),
                min_size=1, max_size=20).filter(lambda name: name not in (".", ".."))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.lists(names, min_size=1, max_size=3).map("/".join),
                          st.integers(0, 0o7777)), max_size=10))
def test_the_record_reads_back_what_was_written(records: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        write_modes(Path(directory), records)
        assert read_modes(Path(directory)) == records


def test_without_new_unreadable_files_the_base_record_is_checked_path_by_path(
        tmp_path: Path) -> None:
    """No walk when the applier made no file without u+r and no hard link: each recorded
    path of the base that still names its inode keeps its mode, the rest are dropped."""
    base = image_tree(tmp_path / "base")
    write_modes(base.parent, keep_owner_readable(base) or [])
    upper = tmp_path / "upper" / "rootfs"
    upper.parent.mkdir()
    link_tree(base, upper)
    os.unlink(upper / "etc/shadow-link")                   # deleted
    os.unlink(upper / "etc/deep/wronly")                   # replaced by a readable file
    (upper / "etc/deep/wronly").write_text("new")
    found = keep_owner_readable(upper, base, unreadable=False, links=False)
    assert found == [("etc/shadow", 0), ("etc/suid", 0o4311)]
    # a hard link made by the layers may have given a recorded inode another name: walked
    os.link(upper / "etc/shadow", upper / "etc/again")
    found = keep_owner_readable(upper, base, unreadable=False, links=True)
    assert dict(found or []) == {"etc/again": 0, "etc/shadow": 0, "etc/suid": 0o4311}
    fresh = tmp_path / "fresh"
    (fresh / "etc").mkdir(parents=True)
    assert keep_owner_readable(fresh, None, unreadable=False, links=True) == []
