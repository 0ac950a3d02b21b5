"""make_bundle from local OCI layouts: streamed unpacking, snapshots, linked and copied bundles.

The layouts are read through the same pull path as a registry (every blob goes through
``store.ingest``), so the streamed unpacking, the follower of growing downloads and the
snapshot store run for real; registries and faults are covered in tests/e2e.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from ocistage.bundler.flows.bundle import make_bundle
from ocistage.bundler.follower import BlobFollower, StreamRestarted
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.cache.digest import Digest
from ocistage.cache.linkprobes import reflinks_work
from ocistage.cache.snapshots import (
    chain_ids,
    find_snapshot,
    list_snapshots,
    publish_snapshot,
    remove_snapshot,
    snapshot_dir,
)
from ocistage.cache.store import Store
from ocistage.errors import IntegrityError
from tests.bundler.tarbuilder import (
    Node,
    build_tar,
    directory,
    file,
    hardlink,
    opaque,
    snapshot,
    symlink,
    whiteout,
    write_oci_layout,
)

BASE = build_tar([
    directory("etc"), file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"),
    file("etc/group", b"root:x:0:\n"), directory("usr"), directory("usr/bin"),
    file("usr/bin/tool", b"#!/bin/sh\necho base\n" * 100, mode=0o755),
    file("usr/bin/setuid", b"s", mode=0o4755), symlink("usr/bin/sh", "tool"),
    hardlink("usr/bin/tool2", "usr/bin/tool"), directory("data", mode=0o555),
    file("data/keep", b"keep"), file("data/gone", b"gone"),
    directory("opq"), file("opq/lower", b"lower"),
])
MIDDLE = build_tar([
    file("usr/bin/tool", b"#!/bin/sh\necho middle\n", mode=0o700),  # replaces a linked file
    whiteout("data/gone"), opaque("opq"), file("opq/upper", b"upper"),
    directory("data", mode=0o750),
])
RUN = ConfigOptions(args=["/usr/bin/tool"])  # the test images define no Cmd
TOP = build_tar([file("top", b"top layer"), hardlink("usr/bin/old", "usr/bin/tool2")])


def layout(tmp_path: Path, name: str, layers: list[bytes], kind: str = "gzip") -> str:
    path = tmp_path / "layouts" / name
    write_oci_layout(path, layers, tag="t", kind=kind)
    return f"oci:{path}:t"


def tree(rootfs: Path) -> dict[str, Node]:
    """The tree without hardlink groups of one name (a linked bundle shares every inode with
    its snapshot, outside the tree)."""
    nodes = snapshot(rootfs)
    return {name: node[:5] if len(node) == 6 and len(node[5]) == 1 else node  # type: ignore[arg-type]
            for name, node in nodes.items()}


def bundle(store: Store, ref: str, dest: Path | None, **kw: object) -> tuple[Path, int, list[int]]:
    seen: list[int] = []
    result = make_bundle(parse_reference(ref), store, dest, config_options=RUN,
                         on_layer=lambda n, _layer: seen.append(n), **kw)  # type: ignore[arg-type]
    return result.path, result.layers_applied, seen


def test_chain_ids_follow_the_image_spec() -> None:
    a = Digest("sha256", "a" * 64)
    b = Digest("sha256", "b" * 64)
    chain = chain_ids([a, b])
    assert chain[0] == a  # ChainID(L0) = DiffID(L0)
    assert chain[1].hex == hashlib.sha256(f"{a} {b}".encode()).hexdigest()


@pytest.mark.parametrize("kind", ["gzip", "zstd", "none"])
def test_copied_linked_and_cached_bundles_hold_the_same_tree(tmp_path: Path,
                                                             kind: str) -> None:
    ref = layout(tmp_path, "img", [BASE, MIDDLE, TOP], kind)
    store = Store.open(tmp_path / "cache")
    copied, applied_copy, _ = bundle(store, ref, tmp_path / "copied")
    linked, applied_link, _ = bundle(store, ref, tmp_path / "linked", link=True)
    cached, applied_cached, _ = bundle(store, ref, None)
    # a first writable DEST keeps no snapshot where a copy is no reflink (tmp_path's
    # filesystem here): the linked bundle unpacks, and the snapshot serves the rest
    keeps = reflinks_work(store.tmp_dir, tmp_path)
    assert (applied_copy, applied_link, applied_cached) == (3, 0 if keeps else 3, 0)
    again, applied_again, _ = bundle(store, ref, tmp_path / "again")
    assert applied_again == 0  # a writable DEST copied from the cached snapshot
    assert tree(again / "rootfs") == tree(copied / "rootfs")
    assert (again / "rootfs/top").stat().st_ino != (linked / "rootfs/top").stat().st_ino
    expected = tree(copied / "rootfs")
    assert tree(linked / "rootfs") == expected
    assert tree(cached / "rootfs") == expected
    assert (copied / "rootfs/usr/bin/tool").read_bytes() == b"#!/bin/sh\necho middle\n"
    assert not (copied / "rootfs/data/gone").exists()
    assert sorted(os.listdir(copied / "rootfs/opq")) == ["upper"]
    assert json.loads((linked / "config.json").read_text())["root"]["readonly"] is True
    assert json.loads((copied / "config.json").read_text())["root"]["readonly"] is False
    snapshots = list_snapshots(store)
    assert len(snapshots) == 1
    shared = snapshots[0].rootfs / "top"
    assert (linked / "rootfs/top").stat().st_ino == shared.stat().st_ino
    assert (copied / "rootfs/top").stat().st_ino != shared.stat().st_ino
    assert not list((tmp_path / "cache" / "tmp").iterdir()), "scratch left in the cache"


def test_a_first_writable_dest_keeps_the_snapshot_where_copies_are_reflinks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the cache and DEST share a filesystem with reflinks (btrfs, XFS), a cold
    writable DEST is unpacked into a snapshot and copied from it (sharing extents): the image
    is never unpacked again. The probe is patched: tmp_path has no reflinks here, and the
    copy (``cp --reflink=auto``) makes a plain copy then."""
    from ocistage.bundler import rootfs

    monkeypatch.setattr(rootfs, "reflinks_work", lambda _source, _dir: True)
    ref = layout(tmp_path, "img", [BASE, MIDDLE, TOP])
    store = Store.open(tmp_path / "cache")
    copied, applied_copy, _ = bundle(store, ref, tmp_path / "copied")
    assert applied_copy == 3
    [snapshot] = list_snapshots(store)
    assert (copied / "rootfs/top").stat().st_ino != (snapshot.rootfs / "top").stat().st_ino
    assert json.loads((copied / "config.json").read_text())["root"]["readonly"] is False
    linked, applied_link, _ = bundle(store, ref, tmp_path / "linked", link=True)
    assert applied_link == 0
    assert tree(linked / "rootfs") == tree(copied / "rootfs")


def test_shared_base_layers_are_unpacked_once(tmp_path: Path) -> None:
    base_ref = layout(tmp_path, "base", [BASE, MIDDLE])
    derived_ref = layout(tmp_path, "derived", [BASE, MIDDLE, TOP])
    store = Store.open(tmp_path / "cache")
    _, applied, seen = bundle(store, base_ref, tmp_path / "base", link=True)
    assert (applied, seen) == (2, [1, 2])
    base_snapshot = snapshot_dir(store, chain_ids(_diff_ids([BASE, MIDDLE]))[-1]) / "rootfs"
    before = tree(base_snapshot)
    path, applied, seen = bundle(store, derived_ref, tmp_path / "derived", link=True)
    assert (applied, seen) == (1, [3])  # only the new layer
    assert tree(base_snapshot) == before, "applying on a linked clone changed its base"
    fresh = Store.open(tmp_path / "fresh")
    reference, _, _ = bundle(fresh, derived_ref, tmp_path / "reference")
    assert tree(path / "rootfs") == tree(reference / "rootfs")
    assert len(list_snapshots(store)) == 2


def test_upper_layers_never_write_into_linked_files(tmp_path: Path) -> None:
    ref_a = layout(tmp_path, "a", [BASE])
    ref_b = layout(tmp_path, "b", [BASE, MIDDLE])
    store = Store.open(tmp_path / "cache")
    a, _, _ = bundle(store, ref_a, tmp_path / "a", link=True)
    before = tree(a / "rootfs")
    bundle(store, ref_b, tmp_path / "b", link=True)
    assert tree(a / "rootfs") == before
    assert (a / "rootfs/usr/bin/tool").stat().st_mode & 0o777 == 0o755


def test_diff_id_mismatch_is_refused_and_nothing_is_published(tmp_path: Path) -> None:
    ref = layout(tmp_path, "bad", [BASE, TOP])
    path = Path(ref.split(":")[1])
    index = json.loads((path / "index.json").read_text())
    manifest_blob = path / "blobs/sha256" / index["manifests"][0]["digest"][7:]
    manifest = json.loads(manifest_blob.read_text())
    config_blob = path / "blobs/sha256" / manifest["config"]["digest"][7:]
    config = json.loads(config_blob.read_text())
    config["rootfs"]["diff_ids"][1] = "sha256:" + "0" * 64
    data = json.dumps(config).encode()
    digest = hashlib.sha256(data).hexdigest()
    (path / "blobs/sha256" / digest).write_bytes(data)
    manifest["config"].update(digest=f"sha256:{digest}", size=len(data))
    mdata = json.dumps(manifest).encode()
    mdigest = hashlib.sha256(mdata).hexdigest()
    (path / "blobs/sha256" / mdigest).write_bytes(mdata)
    index["manifests"][0].update(digest=f"sha256:{mdigest}", size=len(mdata))
    (path / "index.json").write_text(json.dumps(index))
    store = Store.open(tmp_path / "cache")
    for dest, link in ((tmp_path / "copied", False), (tmp_path / "linked", True),
                       (None, False)):
        with pytest.raises(IntegrityError, match="diff_id"):
            make_bundle(parse_reference(ref), store, dest, link=link, config_options=RUN)
        if dest is not None:
            assert not dest.exists()
            assert not [p for p in tmp_path.iterdir() if ".ocistage-" in p.name]
    assert list_snapshots(store) == []
    assert not list((tmp_path / "cache/tmp").iterdir())
    assert not (tmp_path / "cache/bundles").exists() or not any(
        p for p in (tmp_path / "cache/bundles").iterdir() if not p.name.startswith("."))


def _diff_ids(layers: list[bytes]) -> list[Digest]:
    return [Digest("sha256", hashlib.sha256(layer).hexdigest()) for layer in layers]


def test_snapshot_store_list_remove_and_reboot_rule(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    diff_ids = _diff_ids([BASE])
    chain = chain_ids(diff_ids)[-1]
    work = store.temp_dir("snapshot")
    (work / "rootfs").mkdir()
    (work / "rootfs" / "f").write_text("x")
    published = publish_snapshot(store, work, chain, diff_ids, entries=1)
    assert find_snapshot(store, chain) == published
    [info] = list_snapshots(store)
    assert (info.chain_id, info.diff_ids, info.entries) == (chain, tuple(diff_ids), 1)
    # an unsynced snapshot made by this host before a reboot is not trusted
    meta_path = info.path / "snapshot.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "boot_id": "another-boot"}))
    assert find_snapshot(store, chain) is None
    assert not info.path.exists()
    # ... but one made on another host (NFS flushes on close) is
    work = store.temp_dir("snapshot")
    (work / "rootfs").mkdir()
    publish_snapshot(store, work, chain, diff_ids, entries=1)
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "boot_id": "other", "host": "elsewhere"}))
    assert find_snapshot(store, chain) is not None
    remove_snapshot(store, chain)
    remove_snapshot(store, chain)  # absent: no error
    assert list_snapshots(store) == []


def test_follower_reads_a_growing_blob_and_detects_a_restart(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    data = os.urandom(3 << 20)
    digest = Digest.of_bytes(data)
    follower = BlobFollower(store)
    follower.config_ready(digest, None, ())  # type: ignore[arg-type]
    started = threading.Event()
    proceed = threading.Event()

    def download(restart_at: int | None) -> None:
        with store.ingest(digest, len(data)) as ingest:
            assert ingest is not None
            sink = follower.sink(digest, ingest)
            started.set()
            for offset in range(0, len(data), 1 << 16):
                if offset == restart_at:
                    proceed.wait(10)
                    sink.restart()
                    for again in range(0, len(data), 1 << 16):
                        sink.write(data[again:again + (1 << 16)])
                    break
                sink.write(data[offset:offset + (1 << 16)])
            ingest.commit()
        follower.finished(digest, ok=True)

    writer = threading.Thread(target=download, args=(None,))
    writer.start()
    started.wait(10)
    with follower.open(digest) as reader:
        read = b"".join(iter(lambda: reader.read(1 << 20), b""))
    writer.join()
    assert read == data

    store2 = Store.open(tmp_path / "cache2")
    store = store2
    follower = BlobFollower(store2)
    started.clear()
    writer = threading.Thread(target=download, args=(1 << 20,))
    writer.start()
    started.wait(10)
    with pytest.raises(StreamRestarted), follower.open(digest) as reader:
        got = reader.read(1 << 16)
        assert got
        proceed.set()
        while reader.read(1 << 16):
            pass
    writer.join()
