"""ocistage.cache.snapshots.link_tree / split_tree: clones of snapshot trees.

A linked clone has new directories with the source's modes, owners, xattrs and times, and
every other entry (files, symlinks, FIFOs) hard-linked, symlinks never followed — whether one
``cp -al`` makes it or several, each cloning disjoint subtrees.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ocistage.cache.digest import Digest
from ocistage.cache.errors import StoreError
from ocistage.cache.notice import Kind, Notice
from ocistage.cache.snapshots import (
    _DIR_WEIGHT,
    MAX_KEPT_WARNINGS,
    MAX_LINK_PARTS,
    MAX_WARNING_CHARS,
    METADATA,
    MIN_SPLIT_WEIGHT,
    _scan,
    copy_tree,
    free_cpus,
    link_tree,
    publish_snapshot,
    snapshot_warnings,
    split_tree,
)
from ocistage.cache.store import Store
from tests.cache.deeptree import make_chain

Entry = tuple[str, str, int, int, int, int, tuple[tuple[str, bytes], ...]]


def _xattrs(path: Path) -> tuple[tuple[str, bytes], ...]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return ()
    return tuple(sorted((name, os.getxattr(path, name, follow_symlinks=False))
                        for name in names if name.startswith("user.")))


def _listing(root: Path) -> dict[str, Entry]:
    """rel -> (kind, ino-or-0, mode, mtime_ns, uid/gid, xattrs); directory inodes left out."""
    found: dict[str, Entry] = {}
    for path in [root, *root.rglob("*")]:
        info = os.lstat(path)
        rel = os.path.relpath(path, root)
        kind = ("dir" if stat.S_ISDIR(info.st_mode) else "link" if stat.S_ISLNK(info.st_mode)
                else "fifo" if stat.S_ISFIFO(info.st_mode) else "file")
        found[rel] = (kind, 0 if kind == "dir" else info.st_ino, info.st_mode,
                      info.st_mtime_ns if kind == "dir" else 0, info.st_uid, info.st_gid,
                      _xattrs(path) if kind == "dir" else ())
    return found


def _big_tree(root: Path) -> Path:
    """A tree heavy enough to be split, with odd directory modes, xattrs, symlinks, a FIFO."""
    source = root / "snapshot"
    files_per_dir = 250
    subtrees = MIN_SPLIT_WEIGHT // files_per_dir // 3 + 2
    for a in range(3):
        for b in range(subtrees):
            leaf = source / "usr" / f"part{a}" / f"sub{b:02d}"
            leaf.mkdir(parents=True)
            for n in range(files_per_dir):
                (leaf / f"f{n}").touch()
    (source / "usr" / "part0" / "top-file").write_text("x")
    os.symlink("/etc/passwd", source / "usr" / "part1" / "escaping-link")
    os.symlink("missing", source / "usr" / "dangling")
    os.mkfifo(source / "usr" / "part2" / "fifo")
    os.setxattr(source / "usr", "user.ocistage-test", b"usr")
    os.setxattr(source / "usr" / "part1", "user.ocistage-test", b"part1")
    os.chmod(source / "usr" / "part2" / "sub00", 0o555)
    os.chmod(source / "usr" / "part1", 0o2750)
    os.chmod(source / "usr" / "part0", 0o1777)
    for n, directory in enumerate(sorted(p for p in source.rglob("*") if p.is_dir())):
        os.utime(directory, ns=(1_600_000_000_000_000_000 + n, 1_500_000_000_123_456_789 + n),
                 follow_symlinks=False)
    os.utime(source, ns=(1_600_000_000_000_000_000, 1_400_000_000_000_000_001))
    return source


def _assert_clone(source: Path, dest: Path) -> None:
    want, got = _listing(source), _listing(dest)
    assert got == want
    assert os.lstat(dest).st_ino != os.lstat(source).st_ino
    for rel, entry in want.items():
        if entry[0] == "dir":
            assert os.lstat(dest / rel).st_ino != os.lstat(source / rel).st_ino


def test_a_large_tree_is_split_into_disjoint_groups_covering_it(tmp_path: Path) -> None:
    source = _big_tree(tmp_path)
    plan = split_tree(source, 2)
    assert plan is not None
    assert plan.dirs[0] == "" and len(plan.groups) == 2
    for rel in plan.dirs[1:]:
        parent = os.path.dirname(rel)
        assert parent in plan.dirs[:plan.dirs.index(rel)]  # parents come first
    covered: set[str] = set(plan.dirs)
    for group in plan.groups:
        for rel in group:
            assert rel not in covered
            assert os.path.dirname(rel) in plan.dirs  # made before the copies start
            covered.add(rel)
            if (source / rel).is_dir() and not (source / rel).is_symlink():
                covered.update(os.path.relpath(p, source) for p in (source / rel).rglob("*"))
    everything = {"", *(os.path.relpath(p, source) for p in source.rglob("*"))}
    assert covered == everything
    sizes = [sum(1 + sum(1 for _ in (source / rel).rglob("*")) for rel in group)
             for group in plan.groups]
    assert max(sizes) < 1.5 * min(sizes)  # about equal weight


def test_split_clone_equals_single_cp_clone(tmp_path: Path) -> None:
    source = _big_tree(tmp_path)
    link_tree(source, tmp_path / "one", parts=1)
    link_tree(source, tmp_path / "two", parts=2)
    link_tree(source, tmp_path / "three", parts=3)
    _assert_clone(source, tmp_path / "one")
    _assert_clone(source, tmp_path / "two")
    _assert_clone(source, tmp_path / "three")
    link = tmp_path / "two" / "usr" / "part1" / "escaping-link"
    assert os.readlink(link) == "/etc/passwd"  # the symlink itself, linked, never followed
    assert (tmp_path / "two" / "usr" / "part0" / "top-file").read_text() == "x"


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_split_copy_is_an_independent_clone(tmp_path: Path, parts: int) -> None:
    """copy_tree: the same tree as link_tree, but every entry a new inode (a writable DEST)."""
    source = _big_tree(tmp_path)
    (source / "usr" / "part0" / "data").write_bytes(b"payload" * 1000)
    dest = tmp_path / "copy"
    copy_tree(source, dest, parts=parts)
    want, got = _listing(source), _listing(dest)
    assert {rel: entry[:1] + entry[2:] for rel, entry in got.items()} == \
        {rel: entry[:1] + entry[2:] for rel, entry in want.items()}
    for rel in want:
        assert os.lstat(dest / rel).st_ino != os.lstat(source / rel).st_ino, rel
    assert os.readlink(dest / "usr" / "part1" / "escaping-link") == "/etc/passwd"
    (dest / "usr" / "part0" / "data").write_bytes(b"changed")
    assert (source / "usr" / "part0" / "data").read_bytes() == b"payload" * 1000


def test_a_snapshot_keeps_what_unpacking_it_warned_about(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    chain_id = Digest("sha256", "c" * 64)
    work = store.temp_dir("snapshot")
    (work / "rootfs").mkdir()
    warnings = [Notice(Kind.DEVICE_NODE, f"dev/n{n}: character device 1:{n} replaced", 1)
                for n in range(3)] + [Notice(Kind.XATTR, "a: xattr user.x not set")]
    rootfs = publish_snapshot(store, work, chain_id, [chain_id], 1, warnings)
    assert snapshot_warnings(rootfs) == tuple(warnings)
    flood = [Notice(Kind.SKIPPED, f"w{n}:" + "x" * 5000) for n in range(MAX_KEPT_WARNINGS + 50)]
    work = store.temp_dir("snapshot")
    (work / "rootfs").mkdir()
    other = Digest("sha256", "d" * 64)
    kept = snapshot_warnings(publish_snapshot(store, work, other, [other], 1, flood))
    assert len(kept) == MAX_KEPT_WARNINGS  # a flood stays far below the metadata's cap
    assert all(len(w.text) == MAX_WARNING_CHARS for w in kept) and kept[0].text.startswith("w0:")
    assert {w.kind for w in kept} == {Kind.SKIPPED}
    assert snapshot_warnings(tmp_path / "nowhere" / "rootfs") == ()


def test_the_default_uses_the_free_cpus(tmp_path: Path) -> None:
    assert 1 <= free_cpus() <= min(MAX_LINK_PARTS, len(os.sched_getaffinity(0)))
    source = _big_tree(tmp_path)
    link_tree(source, tmp_path / "clone")
    _assert_clone(source, tmp_path / "clone")


def test_small_trees_are_not_split(tmp_path: Path) -> None:
    source = tmp_path / "small"
    (source / "a" / "b").mkdir(parents=True)
    (source / "a" / "b" / "file").write_text("data")
    os.symlink("b/file", source / "a" / "link")
    assert split_tree(source, 2) is None
    link_tree(source, tmp_path / "clone", parts=2)
    _assert_clone(source, tmp_path / "clone")


def test_split_tree_declines_what_it_cannot_read(tmp_path: Path) -> None:
    assert split_tree(tmp_path / "absent", 2) is None
    os.symlink(tmp_path, tmp_path / "link-to-dir")
    assert split_tree(tmp_path / "link-to-dir", 2) is None
    assert split_tree(tmp_path, 1) is None


@pytest.mark.parametrize("parts", [1, 2])
def test_an_existing_destination_is_an_error(tmp_path: Path, parts: int) -> None:
    source = _big_tree(tmp_path) if parts > 1 else tmp_path / "src"
    source.mkdir(exist_ok=True)
    (tmp_path / "dest" / "snapshot").mkdir(parents=True)  # cp would merge into it
    (tmp_path / "dest" / "snapshot" / "usr").mkdir()
    with pytest.raises(StoreError):
        link_tree(source, tmp_path / "dest" / "snapshot" / "usr", parts=parts)


@pytest.mark.parametrize("parts", [1, 2])
def test_a_missing_parent_is_a_store_error(tmp_path: Path, parts: int) -> None:
    source = _big_tree(tmp_path)
    with pytest.raises(StoreError, match=r"cannot copy|failed|permission"):
        link_tree(source, tmp_path / "no" / "such" / "dir", parts=parts)


def test_linking_across_filesystems_fails_as_store_error(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem")
    source = _big_tree(tmp_path)
    dest = shm / f"ocistage-test-link-{os.getpid()}"
    try:
        with pytest.raises(StoreError, match="cannot copy"):
            link_tree(source, dest, parts=2)
    finally:
        os.system(f"chmod -R u+rwx {dest} 2>/dev/null; rm -rf {dest}")


def test_split_tree_scans_deeper_and_longer_than_path_max(tmp_path: Path) -> None:
    source = _big_tree(tmp_path)
    make_chain(source / "usr", 17, 250)  # paths past PATH_MAX, made through descriptors
    before = _scan(_big_tree(tmp_path / "plain")).weight
    assert _scan(source).weight == before + 17 * (_DIR_WEIGHT + 1)  # a directory, a file per level
    plan = split_tree(source, 2)
    # planned entries go to cp as paths: none may come near PATH_MAX (here the chain is
    # heavy enough to be planned, so the split is declined and one cp copies the tree)
    assert plan is None or all(len(rel) < 3000 for group in plan.groups for rel in group)
    # GNU cp itself copies no path past PATH_MAX (`cp -a` of such a tree fails too): a typed
    # error, never a traceback (the caller's scratch directory holds the partial clone)
    with pytest.raises(StoreError, match="too long"):
        link_tree(source, tmp_path / "clone", parts=2)


def test_the_reflink_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    """ocistage.cache.linkprobes.reflinks_work tries a real FICLONE between two probe files and
    removes both; ext4 and tmpfs say no, btrfs/XFS yes; a directory it cannot write in is a no."""
    from ocistage.cache.linkprobes import reflinks_work

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fstype = _fstype(tmp_path)
    result = reflinks_work(tmp_path / "a", tmp_path / "b")
    if fstype in ("ext4", "tmpfs", "ext3", "overlay"):
        assert result is False
    elif fstype in ("btrfs", "xfs"):
        assert result is True
    assert list((tmp_path / "a").iterdir()) == [] and list((tmp_path / "b").iterdir()) == []
    assert reflinks_work(tmp_path / "missing", tmp_path / "b") is False


def _fstype(path: Path) -> str:
    best, kind = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1].replace("\\040", " ")
        if (str(path) + "/").startswith(mount.rstrip("/") + "/") and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


def test_a_snapshot_of_an_earlier_version_keeps_its_warnings_as_text(tmp_path: Path) -> None:
    """Snapshots published before warnings had a kind kept their text: a device node's is
    still known as one (the CLI makes one line of them), any other is kept as it was."""
    store = Store.open(tmp_path / "cache")
    work = store.temp_dir("snapshot")
    (work / "rootfs").mkdir()
    chain_id = Digest("sha256", "e" * 64)
    rootfs = publish_snapshot(store, work, chain_id, [chain_id], 1)
    metadata_path = rootfs.parent / METADATA
    metadata = json.loads(metadata_path.read_text())
    device = "layer 2: dev/null: character device 1:3 replaced by an empty file (rootless)"
    metadata["warnings"] = [device, "layer 1: skipped a: odd", {"kind": "future", "text": "t"},
                            {"text": 3}, 7]
    metadata_path.write_text(json.dumps(metadata))
    assert snapshot_warnings(rootfs) == (Notice(Kind.DEVICE_NODE, device),
                                         Notice(Kind.OTHER, "layer 1: skipped a: odd"),
                                         Notice(Kind.OTHER, "t"))
    assert [str(w) for w in snapshot_warnings(rootfs)][:2] == [device, "layer 1: skipped a: odd"]
