"""What the cache holds (`cache ls`/`du` data): refs and what they reach, bundles, sizes, last use.

Images here are real: hand-made OCI layouts pulled and bundled through ``oci:`` references, so
the store is filled by the same code a registry pull uses. The helpers are shared by the other
cache test modules.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ocistage.bundler.flows.bundle import BundleResult, make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.pull import PulledImage, PullOptions, pull
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.cache import usage
from ocistage.cache.bundleinfo import BUNDLE_INFO, read_bundle_info
from ocistage.cache.digest import Digest
from ocistage.cache.diskusage import disk_usage
from ocistage.cache.inventory import list_blobs, reachable, read_refs
from ocistage.cache.leases import Holder, acquire
from ocistage.cache.listing import listing
from ocistage.cache.store import Store
from ocistage.cache.treesize import tree_shares, tree_size
from tests.bundler.tarbuilder import build_tar, file, write_oci_layout

BASE = os.urandom(64 << 10)  # incompressible, so sizes are predictable


def image_ref(root: Path, tag: str, payload: bytes, base: bytes = BASE) -> str:
    """An OCI layout with a shared base layer plus one layer of its own; its ``oci:`` ref."""
    layers = [build_tar([file("base.bin", base)]),
              build_tar([file(f"{tag}.bin", payload)])]
    write_oci_layout(root / tag, layers, tag=tag, kind="gzip")
    return f"oci:{root / tag}:{tag}"


def pull_ref(store: Store, ref: str, max_size: int | None = None) -> PulledImage:
    return pull(parse_reference(ref), store, PullOptions(max_size=max_size))


def bundle_ref(store: Store, ref: str, dest: Path | None = None,
               max_size: int | None = None) -> BundleResult:
    return make_bundle(parse_reference(ref), store, dest,
                       pull_options=PullOptions(max_size=max_size),
                       config_options=ConfigOptions(args=("/bin/sh",)))


def set_last_use(store: Store, kind: usage.UsageKind, key: str, when: float) -> None:
    path = usage.usage_path(store.root, kind, key)
    assert path.exists(), f"no last use recorded for {kind} {key}"
    os.utime(path, (when, when))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "cache")


def test_listing_shows_sizes_sharing_bundles_and_leases(store: Store, tmp_path: Path) -> None:
    a = image_ref(tmp_path / "src", "a", os.urandom(10_000))
    b = image_ref(tmp_path / "src", "b", os.urandom(20_000))
    pulled_a = pull_ref(store, a)
    made = bundle_ref(store, b)
    lease = acquire(store.root, f"image:{made.image.name}", Holder.pin("keep-b"))
    result = listing(store)
    rows = {row.name: row for row in result.images}
    assert set(rows) == {pulled_a.name, made.image.name}
    blobs = list_blobs(store)
    for pulled, row in ((pulled_a, rows[pulled_a.name]), (made.image, rows[made.image.name])):
        reached = {pulled.manifest.digest, pulled.config_digest,
                   *(layer.digest for layer in pulled.layers)}
        assert row.size == sum(blobs[d].size for d in reached)
        base_layer = pulled.layers[0].digest
        assert row.unique_size == row.size - blobs[base_layer].size  # the base is shared
        assert row.digest == str(pulled.manifest.digest) and row.platform == "linux/amd64"
        assert row.missing == ()
    assert rows[pulled_a.name].bundles == () and rows[pulled_a.name].leases == ()
    assert rows[made.image.name].bundles == (made.path.name,)
    assert [(x.id, x.holder, x.live) for x in rows[made.image.name].leases] == [
        (lease.id, "pin keep-b", True)]
    [bundle] = result.bundles
    assert bundle.key == made.path.name and not bundle.orphan
    assert bundle.image == made.image.name and bundle.manifest == str(made.image.manifest.digest)
    assert bundle.disk == tree_size(made.path).disk > 64 << 10
    assert [x.id for x in result.leases] == [lease.id]


def test_bundle_sizes_do_not_depend_on_the_order_of_listing(store: Store,
                                                            tmp_path: Path) -> None:
    """Two bundles of one content (hard links of one snapshot): each has the same SIZE, and
    UNIQUE counts only what no other tree links (its directories and its config.json)."""
    ref = image_ref(tmp_path / "src", "a", os.urandom(100_000))
    made = [make_bundle(parse_reference(ref), store, None,
                        config_options=ConfigOptions(args=(f"/bin/{n}",))) for n in ("a", "b")]
    rows = {row.key: row for row in listing(store).bundles}
    assert len(rows) == 2
    sizes = [(rows[m.path.name].disk, rows[m.path.name].unique) for m in made]
    own = tree_size(made[0].path).disk
    assert sizes[0] == sizes[1] and sizes[0][0] == own > 150 << 10
    assert 0 < sizes[0][1] < 64 << 10  # the payloads are shared with the snapshot
    private = bundle_ref(store, ref, tmp_path / "copy").path  # a copy shares nothing
    assert tree_shares(private) == (tree_size(private).disk,) * 2
    os.link(private / "config.json", tmp_path / "elsewhere")
    disk, unique = tree_shares(private)
    assert unique == disk - (private / "config.json").stat().st_blocks * 512


def test_disk_usage_counts_shared_blobs_and_hardlinks_once(store: Store, tmp_path: Path) -> None:
    a = image_ref(tmp_path / "src", "a", os.urandom(10_000))
    b = image_ref(tmp_path / "src", "b", os.urandom(10_000))
    pull_ref(store, a)
    made = bundle_ref(store, b)
    before = disk_usage(store)
    big = made.path / "rootfs" / "base.bin"
    os.link(big, made.path / "rootfs" / "again.bin")  # a hardlink inside the bundle
    after = disk_usage(store)
    blobs = list_blobs(store)
    base = blobs[made.image.layers[0].digest]
    assert after.blobs.count == len(blobs) == 7  # 2 manifests, 2 configs, 3 distinct layers
    assert after.blobs.logical == sum(b.size for b in blobs.values())
    assert after.images.count == 2
    assert after.images.logical == after.blobs.logical + base.size  # base counted per image
    assert after.bundles.count == 1
    assert after.bundles.logical == before.bundles.logical + len(BASE)
    assert after.bundles.disk == before.bundles.disk  # the link adds no blocks
    assert after.scratch.disk == 0 and after.quarantine.count == 0
    assert after.total_disk >= after.blobs.disk + after.bundles.disk


def test_tree_size_never_follows_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(100_000))
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "link").symlink_to(outside)
    (tree / "small").write_bytes(b"x" * 10)
    size = tree_size(tree)
    assert size.files == 2 and size.logical == 10 + len(str(outside))


def test_pull_and_bundle_record_last_use(store: Store, tmp_path: Path) -> None:
    ref = image_ref(tmp_path / "src", "a", b"payload")
    made = bundle_ref(store, ref)
    key, manifest = made.path.name, made.image.manifest.digest.hex
    old = time.time() - 3 * 86400
    set_last_use(store, "image", manifest, old)
    set_last_use(store, "bundle", key, old)
    again = bundle_ref(store, ref)
    assert again.reused
    now = time.time()
    for kind, entry in (("image", manifest), ("bundle", key)):
        used = usage.last_used(store.root, kind, entry)  # type: ignore[arg-type]
        assert used is not None and now - used < 60
    row = listing(store).images[0]
    assert now - row.last_used < 60


def test_last_use_falls_back_to_the_resolution_time(store: Store, tmp_path: Path) -> None:
    pulled = pull_ref(store, image_ref(tmp_path / "src", "a", b"payload"))
    usage.forget(store.root, "image", pulled.manifest.digest.hex)
    row = listing(store).images[0]
    assert abs(row.last_used - time.time()) < 120


def test_cached_bundles_record_their_manifest(store: Store, tmp_path: Path) -> None:
    ref = image_ref(tmp_path / "src", "a", b"payload")
    made = bundle_ref(store, ref)
    assert read_bundle_info(made.path) == (made.image.manifest.digest, made.image.name)
    user_bundle = bundle_ref(store, ref, tmp_path / "mine")
    assert not (user_bundle.path / BUNDLE_INFO).exists()  # only cached bundles carry it
    info = made.path / BUNDLE_INFO
    target = tmp_path / "fake.json"
    target.write_text(json.dumps({"manifest": "sha256:" + "0" * 64}))
    info.unlink()
    info.symlink_to(target)
    assert read_bundle_info(made.path) == (None, None)  # never read through a link


def test_refs_reach_index_children_and_report_missing_blobs(store: Store,
                                                            tmp_path: Path) -> None:
    pulled = pull_ref(store, image_ref(tmp_path / "src", "a", b"payload"))
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": pulled.manifest.media_type, "digest": str(pulled.manifest.digest),
         "size": pulled.manifest.size},
        {"mediaType": pulled.manifest.media_type, "digest": "sha256:" + "e" * 64, "size": 1},
    ]}).encode()
    index_digest = store.put_blob(index)
    present, missing = reachable(store, index_digest)
    assert set(present) == {index_digest, pulled.manifest.digest, pulled.config_digest,
                            *(layer.digest for layer in pulled.layers)}
    assert missing == [Digest.parse("sha256:" + "e" * 64)]
    os.unlink(store.blob_path(pulled.layers[1].digest))
    [ref] = read_refs(store)
    assert ref.missing == (pulled.layers[1].digest,)
    assert listing(store).images[0].missing == (str(pulled.layers[1].digest),)
