"""ocistage.cache.targetlayout: the staged-bundle layout as GC sees it — opening
without following links, removal through descriptors, the outer marker, and the pool sweep (link
count 1 only)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ocistage.cache import targetlayout
from ocistage.cache.gc import GcOptions, collect
from ocistage.cache.leases import Holder, acquire, all_leases
from ocistage.cache.store import Store


def no_jobs(job_ids: object) -> dict[str, str]:
    return {}


def make_staged(path: Path, lease_id: str, **marker: object) -> Path:
    (path / "rootfs").mkdir(parents=True)
    (path / "rootfs" / "file").write_text("data\n")
    (path / targetlayout.MARKER_NAME).write_text(json.dumps({"id": lease_id, **marker}))
    return path


def pool_entry(target: Path, key: str, data: bytes = b"x") -> Path:
    entry = target / targetlayout.POOL_DIR / key[:2] / key
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(data)
    return entry


def test_sweep_removes_only_unlinked_regular_entries(tmp_path: Path) -> None:
    target = tmp_path / "t"
    lone = pool_entry(target, "aa01-0644")
    shared = pool_entry(target, "aa02-0644")
    os.link(shared, tmp_path / "bundle-file")
    outside = tmp_path / "outside"
    outside.write_text("keep\n")
    link = target / targetlayout.POOL_DIR / "aa" / "aa03-0644"
    os.symlink(outside, link)                      # never followed, never removed
    busy = pool_entry(target, "aa04-0644.1-abc.tmp")  # a stager writing it right now
    assert targetlayout.sweep_pool(target) == 1
    assert not lone.exists() and shared.exists() and link.is_symlink() and busy.exists()
    assert outside.read_text() == "keep\n"
    old = time.time() - 2 * targetlayout.TEMP_GRACE
    os.utime(busy, (old, old))
    assert targetlayout.sweep_pool(target) == 1 and not busy.exists()
    assert targetlayout.sweep_pool(tmp_path / "no-target") == 0


def test_pool_behind_a_symlink_is_not_swept(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    entry = pool_entry(elsewhere, "bb01-0644")
    target = tmp_path / "t"
    target.mkdir()
    os.symlink(elsewhere / targetlayout.POOL_DIR, target / targetlayout.POOL_DIR)
    assert targetlayout.sweep_pool(target) == 0 and entry.exists()


def test_open_staged_needs_a_real_directory_with_a_marker(tmp_path: Path) -> None:
    bundle = make_staged(tmp_path / "b", "L1")
    os.symlink(bundle, tmp_path / "link")
    (tmp_path / "plain").mkdir()
    assert targetlayout.open_staged(tmp_path / "link") is None
    assert targetlayout.open_staged(tmp_path / "plain") is None
    assert targetlayout.open_staged(tmp_path / "missing") is None
    opened = targetlayout.open_staged(bundle)
    assert opened is not None
    try:
        assert opened.lease_ids() == {"L1"} and not opened.mounted
    finally:
        opened.close()


def test_outer_marker_counts_only_for_a_mounted_image(tmp_path: Path) -> None:
    bundle = make_staged(tmp_path / "b", "from-the-image")
    (tmp_path / targetlayout.outer_marker_name("b")).write_text(json.dumps({"id": "L2"}))
    opened = targetlayout.open_staged(bundle)
    assert opened is not None
    try:
        assert opened.outer == {"id": "L2"}
        assert opened.lease_ids() == {"from-the-image"}  # a plain directory: not mounted
    finally:
        opened.close()


def test_remove_takes_the_tree_image_and_outer_marker_not_what_links_point_to(
        tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep\n")
    bundle = make_staged(tmp_path / "t" / "b", "L", image="b.sqfs")
    os.symlink(outside, bundle / "rootfs" / "escape")
    (bundle / "rootfs" / "ro").mkdir()
    (bundle / "rootfs" / "ro" / "f").write_text("x")
    (bundle / "rootfs" / "ro").chmod(0o500)
    (tmp_path / "t" / "b.sqfs").write_bytes(b"image")
    (tmp_path / "t" / targetlayout.outer_marker_name("b")).write_text("{}")
    (tmp_path / "t" / "other").write_text("stays\n")
    opened = targetlayout.open_staged(bundle)
    assert opened is not None
    targetlayout.remove(opened)
    assert sorted(os.listdir(tmp_path / "t")) == ["other"]
    assert (outside / "precious").read_text() == "keep\n"


def test_image_named_with_a_path_is_never_removed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.sqfs"
    victim.write_bytes(b"not ours")
    bundle = make_staged(tmp_path / "t" / "b", "L", image="../victim.sqfs")
    opened = targetlayout.open_staged(bundle)
    assert opened is not None
    targetlayout.remove(opened)
    assert victim.exists() and not bundle.exists()


@pytest.mark.parametrize("dry_run", [False, True])
def test_gc_removes_a_dead_pool_bundle_and_sweeps_only_its_pool_entries(
        tmp_path: Path, dry_run: bool) -> None:
    store = Store.open(tmp_path / "cache")
    target = tmp_path / "target"
    dead, live = target / "dead", target / "live"
    dead_lease = acquire(store.root, f"staged:{dead}", Holder.slurm_job("41"))
    live_lease = acquire(store.root, f"staged:{live}", Holder.pin("keep"))
    make_staged(dead, dead_lease.id, method="pool")
    make_staged(live, live_lease.id, method="pool")
    only_dead = pool_entry(target, "cc01-0644", b"only dead")
    shared = pool_entry(target, "cc02-0644", b"shared")
    os.link(only_dead, dead / "rootfs" / "a")
    os.link(shared, dead / "rootfs" / "b")
    os.link(shared, live / "rootfs" / "b")
    outside = tmp_path / "not-a-pool-entry"
    outside.write_text("keep\n")
    report = collect(store, GcOptions(dry_run=dry_run), job_states=no_jobs)
    assert {r.name for r in report.removed if r.kind == "staged"} == {str(dead)}
    if dry_run:
        assert dead.exists() and only_dead.exists()
        return
    assert not dead.exists() and not only_dead.exists()
    assert shared.exists() and (live / "rootfs" / "b").read_bytes() == b"shared"
    assert outside.read_text() == "keep\n"
    assert [lease.id for lease in all_leases(store.root)] == [live_lease.id]
