"""issue 27.14: a write in place through a bundle linked to a snapshot changes the snapshot.

The record of a snapshot's entries (``ocistage.cache.snapshotfiles``) finds every such change
and nothing else (linking and unlinking the files, which sets their ctime, is no change);
``find_snapshot`` sets a changed snapshot aside, with the cached bundles sharing the change,
before anything is made from it; ``cache verify`` reports and quarantines them.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

import pytest

from ocistage.cache import snapshotfiles
from ocistage.cache.dirfds import open_parent
from ocistage.cache.errors import StoreError
from ocistage.cache.snapshots import find_snapshot, link_tree, list_snapshots, snapshot_dir
from ocistage.cache.store import Store
from ocistage.cache.treewalk import walk_entries
from ocistage.cache.verify import verify
from tests.bundler.tarbuilder import build_tar, file, write_oci_layout
from tests.cache.test_inventory import BASE, bundle_ref, image_ref

ODD_NAMES = ("a", "a-b", "a.b", "line\nbreak", "caf\udce9", "Z", "_")


def make_tree(root: Path) -> None:
    """Files beside and below directories whose names sort around ``/``, odd names."""
    root.mkdir()
    for name in ODD_NAMES:
        (root / name).mkdir()
        (root / name / "f").write_bytes(name.encode(errors="surrogateescape"))
        (root / f"{name}.txt").write_bytes(b"x" * len(name))
    (root / "a" / "deep" / "er").mkdir(parents=True)
    (root / "a" / "deep" / "er" / "leaf").write_bytes(b"leaf")
    (root / "a" / "link").symlink_to("../Z/f")
    os.mkfifo(root / "a" / "fifo")
    os.link(root / "a" / "f", root / "a" / "hardlink")


@pytest.fixture
def snap(tmp_path: Path) -> Path:
    """A snapshot directory (``rootfs`` + its record), as published."""
    directory = tmp_path / "snap"
    directory.mkdir()
    make_tree(directory / "rootfs")
    snapshotfiles.write_record(directory)
    return directory


def changes(directory: Path) -> dict[str, str]:
    found = snapshotfiles.check(directory)
    assert found is not None
    assert found.count == len(found.changes)
    return {change.path: change.detail for change in found.changes}


def test_an_untouched_snapshot_is_unchanged_even_after_links_come_and_go(
        snap: Path, tmp_path: Path) -> None:
    """cp -al and rm -r of a bundle set the ctime of every shared file: no change."""
    before = {p: p.lstat().st_ctime_ns for p in (snap / "rootfs").rglob("*")}
    assert changes(snap) == {}
    link_tree(snap / "rootfs", tmp_path / "bundle", parts=1)
    shutil.rmtree(tmp_path / "bundle")
    after = {p: p.lstat().st_ctime_ns for p in (snap / "rootfs").rglob("*")}
    assert after[snap / "rootfs/a/f"] != before[snap / "rootfs/a/f"]  # ctime did move
    assert changes(snap) == {}
    assert snapshotfiles.check(snap) == snapshotfiles.Check((), 0)


def test_a_write_in_place_through_a_linked_clone_is_named(snap: Path, tmp_path: Path) -> None:
    link_tree(snap / "rootfs", tmp_path / "bundle", parts=1)
    rootfs = tmp_path / "bundle"
    with open(rootfs / "a.txt", "ab") as file:                 # echo x >> FILE
        file.write(b"more")
    with open(rootfs / "caf\udce9" / "f", "r+b") as file:      # same size, new content
        file.write(b"C")
    os.chmod(rootfs / "Z.txt", 0o4755)                           # chmod of the shared inode
    os.utime(rootfs / "line\nbreak" / "f", ns=(1, 1))            # touch -d
    found = changes(snap)
    assert set(found) == {"a.txt", "caf\udce9/f", "Z.txt", "line\nbreak/f"}
    assert found["a.txt"].startswith("size 1 -> 5, modified at ")
    assert found["caf\udce9/f"].startswith("modified at ")
    assert found["Z.txt"] == "mode 100644 -> 104755"
    assert found["line\nbreak/f"] == "modified at 1970-01-01T00:00:00Z"
    recorded = {c.path: c.inode for c in snapshotfiles.check(snap).changes}  # type: ignore[union-attr]
    assert recorded["a.txt"] == (snap / "rootfs/a.txt").stat().st_ino


def test_entries_replaced_removed_added_and_a_truncated_file(snap: Path) -> None:
    rootfs = snap / "rootfs"
    (rootfs / "a-b.txt").unlink()
    (rootfs / "a" / "new").write_bytes(b"")
    (rootfs / "a" / "deep" / "er" / "new-dir").mkdir()
    shutil.rmtree(rootfs / "a.b")
    (rootfs / "_.txt").rename(rootfs / "_.old")
    (rootfs / "_.txt").write_bytes(b"x")                 # same size and name, another inode
    os.truncate(rootfs / "a" / "deep" / "er" / "leaf", 0)
    found = changes(snap)
    assert found.pop("_.txt").startswith("replaced (another inode)")
    assert found.pop("a/deep/er/leaf").startswith("size 4 -> 0")
    assert found == {"a-b.txt": "removed", "a/new": "added", "a/deep/er/new-dir": "added",
                     "a.b": "removed", "a.b/f": "removed", "_.old": "added"}


def test_the_first_changes_are_named_and_all_counted(snap: Path) -> None:
    for index in range(snapshotfiles.MAX_LISTED + 5):
        (snap / "rootfs" / f"new{index:02}").write_bytes(b"")
    found = snapshotfiles.check(snap)
    assert found is not None and found.count == snapshotfiles.MAX_LISTED + 5
    assert len(found.changes) == snapshotfiles.MAX_LISTED
    assert found.describe().endswith("; and 5 more)")


def test_no_record_another_format_and_a_damaged_record(snap: Path) -> None:
    record = snap / snapshotfiles.FILES
    data = record.read_bytes()
    record.write_bytes(data[:-3])
    assert changes(snap) == {snapshotfiles.FILES: "the record is damaged"}
    header = len(snapshotfiles.HEADER)
    record.write_bytes(data[:header] + data[header:].replace(b" ", b" 1 ", 1))  # 7 fields
    assert changes(snap) == {snapshotfiles.FILES: "the record is damaged"}
    record.write_bytes(data.replace(b"files 1", b"files 2", 1))
    assert snapshotfiles.check(snap) is None
    record.unlink()
    assert snapshotfiles.check(snap) is None
    record.symlink_to(tmp := snap / "elsewhere")
    tmp.write_bytes(data)
    with pytest.raises(OSError):  # O_NOFOLLOW: a planted link is not read
        snapshotfiles.check(snap)


def test_walk_entries_is_sorted_and_pre_order(snap: Path) -> None:
    parent_fd, name = open_parent(snap / "rootfs")
    try:
        walked = [(rel, [entry for entry, _st in entries])
                  for rel, entries in walk_entries(parent_fd, name)]
    finally:
        os.close(parent_fd)
    dirs = [rel for rel, _ in walked]
    assert dirs == sorted(dirs, key=lambda rel: rel.split("/") if rel else [])
    assert dirs[:4] == ["", "Z", "_", "a"] and dirs.index("a/deep/er") < dirs.index("a-b")
    assert all(entries == sorted(entries) for _, entries in walked)
    assert len(walked) == len(ODD_NAMES) + 3


# -- find_snapshot and cache verify on a real cache ------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "cache")


def test_find_snapshot_sets_a_changed_snapshot_and_its_linked_bundles_aside(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ref_a = image_ref(tmp_path / "src", "a", b"payload of a")
    cached = bundle_ref(store, ref_a)
    copied = bundle_ref(store, ref_a, tmp_path / "copy")          # a private copy
    other = bundle_ref(store, image_ref(tmp_path / "src", "b", b"b"))  # shares the base layer
    snapshot = cached.snapshot
    assert snapshot is not None
    [chain] = [s.chain_id for s in list_snapshots(store) if s.rootfs == snapshot]
    with open(cached.path / "rootfs/a.bin", "ab") as file:
        file.write(b" and more")
    with caplog.at_level(logging.WARNING, "ocistage.cache.snapshotfiles"):
        assert find_snapshot(store, chain) is None
    assert "a.bin: size 12 -> 21" in caplog.text and "moved too: 1)" in caplog.text
    assert not snapshot_dir(store, chain).exists() and not cached.path.exists()
    assert other.path.exists() and copied.path.exists()  # they do not share a.bin
    assert sorted(p.name.split("-")[0] for p in (store.root / "quarantine").iterdir()) == [
        "bundle", "snapshot"]
    again = bundle_ref(store, ref_a)
    assert again.path == cached.path and not again.reused and again.layers_applied == 2
    assert (again.path / "rootfs/a.bin").read_bytes() == b"payload of a"
    assert verify(store).ok


def base_ref(root: Path) -> str:
    """A one-layer image of the base layer :func:`image_ref`'s images share."""
    write_oci_layout(root / "base", [build_tar([file("base.bin", BASE)])], tag="base",
                     kind="gzip")
    return f"oci:{root / 'base'}:base"


def test_a_changed_base_is_not_built_upon(store: Store, tmp_path: Path) -> None:
    """Image a is built on the base image's snapshot: a write into a file of the base layer
    through a's bundle changes both snapshots and both cached bundles; image c, on the same
    base, does not inherit it, and verify finds a's snapshot changed too."""
    base = bundle_ref(store, base_ref(tmp_path / "src"))
    a = bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    assert a.layers_applied == 1  # linked from the base's snapshot
    with open(a.path / "rootfs/base.bin", "r+b") as file:
        file.write(b"X")
    assert (base.path / "rootfs/base.bin").read_bytes()[:1] == b"X"
    c = bundle_ref(store, image_ref(tmp_path / "src", "c", b"c"))
    assert c.layers_applied == 2  # the base snapshot was set aside: unpacked again
    assert (c.path / "rootfs/base.bin").read_bytes() == BASE
    assert not base.path.exists() and not a.path.exists()
    report = verify(store)
    assert [(p.kind, p.name) for p in report.problems] == [
        ("changed-snapshot", f"sha256:{a.snapshot.parent.name}")]  # type: ignore[union-attr]
    assert "base.bin: modified at" in report.problems[0].detail
    assert report.snapshots == 2  # a's and c's
    assert verify(store).ok and c.path.exists()


def test_verify_reports_and_quarantines_changed_snapshots(store: Store, tmp_path: Path) -> None:
    ref = image_ref(tmp_path / "src", "a", b"payload")
    cached = bundle_ref(store, ref)
    assert verify(store).snapshots == 1
    os.chmod(cached.path / "rootfs/a.bin", 0o777)
    dry = verify(store, dry_run=True)
    assert [(p.kind, p.action) for p in dry.problems] == [
        ("changed-snapshot", "none (dry run)"), ("changed-bundle", "none (dry run)")]
    snapshot = next(p for p in dry.problems if p.kind == "changed-snapshot")
    assert snapshot.detail == ("1 entry changed since it was published "
                               "(a.bin: mode 100644 -> 100777)")
    assert cached.path.exists()
    report = verify(store)
    assert [p.kind for p in report.problems] == ["changed-snapshot", "changed-bundle"]
    assert all(p.action.startswith("quarantined to ") for p in report.problems)
    assert not cached.path.exists() and list_snapshots(store) == []
    assert verify(store).ok


def test_a_snapshot_without_a_record_is_made_again(store: Store, tmp_path: Path) -> None:
    ref = image_ref(tmp_path / "src", "a", b"payload")
    first = bundle_ref(store, ref)
    for info in list_snapshots(store):
        (info.path / snapshotfiles.FILES).unlink()  # as an older ocistage left it
    report = verify(store, dry_run=True)
    assert [p.kind for p in report.problems] == ["unchecked-snapshot"]
    assert len(list_snapshots(store)) == 1
    report = verify(store)
    assert list_snapshots(store) == [] and first.path.exists()
    shutil.rmtree(first.path)
    again = bundle_ref(store, ref)
    assert again.layers_applied == 2 and verify(store).ok
    (again.snapshot.parent / snapshotfiles.FILES).unlink()  # type: ignore[union-attr]
    assert bundle_ref(store, ref, tmp_path / "dest").layers_applied == 2


def test_a_snapshot_that_cannot_be_set_aside_is_an_error(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rebuilding would find the changed snapshot still published and use it: refused."""
    ref = image_ref(tmp_path / "src", "a", b"payload")
    cached = bundle_ref(store, ref)
    with open(cached.path / "rootfs/a.bin", "ab") as file:
        file.write(b"!")

    def refused(_store: Store, path: Path, _label: str) -> Path:
        raise StoreError(f"cannot quarantine {path}: Permission denied")

    def no_rename(path: Path) -> Path:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(snapshotfiles, "quarantine", refused)
    monkeypatch.setattr(snapshotfiles, "evict", no_rename)
    with pytest.raises(StoreError, match=r"cannot quarantine .*snapshots"):
        bundle_ref(store, ref, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_a_snapshot_that_cannot_be_quarantined_is_evicted_beside_it(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another member's changed snapshot that the caller may not move to quarantine/ (a
    rename into another directory needs write access to the tree): renamed beside it
    instead (``.evicted-*``, its owner's next command removes it), and the bundle is made
    from a snapshot rebuilt from the blobs."""
    ref = image_ref(tmp_path / "src", "a", b"payload")
    cached = bundle_ref(store, ref)
    with open(cached.path / "rootfs/a.bin", "ab") as file:
        file.write(b"!")

    def refused(_store: Store, path: Path, _label: str) -> Path:
        raise StoreError(f"cannot quarantine {path}: Permission denied")

    monkeypatch.setattr(snapshotfiles, "quarantine", refused)
    published = [p for p in (store.root / "snapshots").iterdir()]
    made = bundle_ref(store, ref, tmp_path / "dest")
    assert (made.path / "rootfs/a.bin").read_bytes() == b"payload"
    evicted = list((store.root / "snapshots").glob(".evicted-*"))
    assert [p.name.partition("-")[2].rpartition("-")[0] for p in evicted] == [
        p.name for p in published]
    assert not (store.root / "quarantine").exists()


def test_a_cached_bundle_that_cannot_be_set_aside_is_a_warning(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    ref = image_ref(tmp_path / "src", "a", b"payload")
    cached = bundle_ref(store, ref)
    with open(cached.path / "rootfs/a.bin", "ab") as file:
        file.write(b"!")
    real = snapshotfiles.quarantine

    def bundles_refused(store_: Store, path: Path, label: str) -> Path:
        if label == "bundle":
            raise StoreError(f"cannot quarantine {path}: Permission denied")
        return real(store_, path, label)

    def no_rename(path: Path) -> Path:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(snapshotfiles, "quarantine", bundles_refused)
    monkeypatch.setattr(snapshotfiles, "evict", no_rename)
    with caplog.at_level(logging.WARNING, "ocistage.cache.snapshotfiles"):
        made = bundle_ref(store, ref, tmp_path / "dest")
    assert (made.path / "rootfs/a.bin").read_bytes() == b"payload"
    assert f"cannot quarantine {cached.path}" in caplog.text and "moved too: 0)" in caplog.text
    assert cached.path.exists()  # left where it is: the warning names it
