"""GC: orphans and leftovers go, LRU eviction to a budget, leases always win, staged bundles
are removed only through their marker, and crashes at chosen points leave a cache that the next
run completes (and that verifies clean)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.bundler.flows import bundle as bundle_module
from ocistage.bundler.flows.bundle import BundleResult
from ocistage.cache import usage
from ocistage.cache.builddirs import scratch_name
from ocistage.cache.digest import Digest
from ocistage.cache.diskusage import disk_usage
from ocistage.cache.errors import StoreError
from ocistage.cache.gc import GcOptions, GcReport, collect, enforce_budget, remove_ref
from ocistage.cache.ingest import Ingest
from ocistage.cache.inventory import bundle_scratch_dirs, list_blobs, list_bundles, read_refs
from ocistage.cache.leases import (
    GC_LOCK,
    Holder,
    InUse,
    Lease,
    acquire,
    all_leases,
    gc_running,
    release,
)
from ocistage.cache.listing import listing
from ocistage.cache.locks import FileLock
from ocistage.cache.notice import Kind
from ocistage.cache.snapshots import chain_ids, lease_target, list_snapshots
from ocistage.cache.store import Store, quarantine
from ocistage.cache.verify import verify
from ocistage.errors import NotFound
from tests.cache.gclock import GcChecks, gc_lock_held
from tests.cache.test_inventory import BASE, bundle_ref, image_ref, pull_ref, set_last_use
from tests.cache.test_refnames import NAMES, PLATFORMS, manifest
from tests.cache.test_refnames import check as check_names


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "cache")


def no_jobs(job_ids: object) -> dict[str, str]:
    return {}


def run_gc(store: Store, **options: object) -> GcReport:
    return collect(store, GcOptions(**options), job_states=no_jobs)  # type: ignore[arg-type]


def removed(report: GcReport, kind: str) -> set[str]:
    return {r.name for r in report.removed if r.kind == kind}


def ref_names(store: Store) -> set[str]:
    return {ref.name for ref in read_refs(store)}


def dead_pid_holder() -> Holder:
    """The holder of a process that has exited (its pid is gone)."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    return Holder("pid", host=socket.gethostname(), pid=int(child.stdout), start="1")


def du(path: Path) -> int:
    """Bytes on disk under ``path`` as the real ``du`` counts them (each inode once)."""
    out = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0])


def assert_layout_consistent(store: Store) -> None:
    """Every ref reaches only blobs that exist; verify finds nothing."""
    for ref in read_refs(store):
        assert ref.missing == (), ref
    assert verify(store).ok


# -- orphans ---------------------------------------------------------------------------------

def test_gc_without_options_keeps_everything_referenced(store: Store, tmp_path: Path) -> None:
    bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    pull_ref(store, image_ref(tmp_path / "src", "b", b"b"))
    blobs = set(list_blobs(store))
    report = run_gc(store)
    assert [r for r in report.removed if r.kind != "usage"] == []
    assert set(list_blobs(store)) == blobs and len(list_bundles(store)) == 1
    assert report.size_after == report.size_before


def test_dropped_ref_takes_its_own_blobs_and_bundles_not_shared_ones(store: Store,
                                                                    tmp_path: Path) -> None:
    a = bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    b = pull_ref(store, image_ref(tmp_path / "src", "b", b"b"))
    store.untag(lambda entry: entry["digest"] == str(a.image.manifest.digest))
    report = run_gc(store)
    own = {a.image.manifest.digest, a.image.config_digest, a.image.layers[1].digest}
    assert removed(report, "blob") == {str(d) for d in own}
    assert removed(report, "bundle") == {a.path.name}
    assert not a.path.exists()
    assert set(list_blobs(store)) == {b.manifest.digest, b.config_digest,
                                      *(layer.digest for layer in b.layers)}
    assert usage.last_used(store.root, "bundle", a.path.name) is None
    assert usage.last_used(store.root, "image", a.image.manifest.digest.hex) is None
    assert ref_names(store) == {b.name}
    assert_layout_consistent(store)


def test_bundles_of_unknown_images_are_orphans(store: Store, tmp_path: Path) -> None:
    made = bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    (made.path / ".ocistage-bundle.json").unlink()
    report = run_gc(store)
    assert removed(report, "bundle") == {made.path.name} and not made.path.exists()
    assert ref_names(store) == {made.image.name}  # the image itself stays


def test_dry_run_reports_what_a_real_run_removes(store: Store, tmp_path: Path) -> None:
    old = pull_ref(store, image_ref(tmp_path / "src", "old", b"o"))
    pull_ref(store, image_ref(tmp_path / "src", "new", b"n"))
    set_last_use(store, "image", old.manifest.digest.hex, time.time() - 10 * 86400)
    blobs_before = set(list_blobs(store))
    dry = run_gc(store, older_than=86400.0, dry_run=True)
    assert set(list_blobs(store)) == blobs_before and old.name in ref_names(store)
    real = run_gc(store, older_than=86400.0)
    assert [(r.kind, r.name, r.size) for r in dry.removed] == \
        [(r.kind, r.name, r.size) for r in real.removed]
    assert any(r.kind == "usage" for r in real.removed)
    assert dry.size_after == real.size_after
    assert old.name not in ref_names(store)


def test_snapshots_live_while_a_cached_image_starts_with_their_layers(store: Store,
                                                                      tmp_path: Path) -> None:
    a = bundle_ref(store, image_ref(tmp_path / "src", "a", os.urandom(100_000)))
    b = bundle_ref(store, image_ref(tmp_path / "src", "b", os.urandom(100_000)))
    chain_a = chain_ids(a.image.config.diff_ids)[-1]
    chain_b = chain_ids(b.image.config.diff_ids)[-1]
    assert {s.chain_id for s in list_snapshots(store)} == {chain_a, chain_b}
    usage_before = disk_usage(store)
    assert usage_before.snapshots.count == 2
    # bundle files are hard links to snapshot files: on disk they count with the snapshot
    assert usage_before.bundles.disk < usage_before.bundles.logical
    assert run_gc(store).removed == ()
    pin = acquire(store.root, lease_target(chain_a), Holder.pin("building"))
    report = remove_ref(store, a.image.name, job_states=no_jobs)
    assert removed(report, "snapshot") == set() and removed(report, "bundle") == {a.path.name}
    assert {s.chain_id for s in list_snapshots(store)} == {chain_a, chain_b}
    release(store.root, pin.id)
    report = run_gc(store)
    assert removed(report, "snapshot") == {str(chain_a)}
    assert [s.chain_id for s in list_snapshots(store)] == [chain_b]
    assert (b.path / "rootfs" / "b.bin").stat().st_size == 100_000
    report = run_gc(store, max_size=0)
    assert list_snapshots(store) == [] and report.size_after == report.size_floor
    assert list(store.tmp_dir.iterdir()) == []


# -- eviction --------------------------------------------------------------------------------

def three_images(store: Store, tmp_path: Path) -> list[str]:
    """Images a (used 3 days ago), b (2 days), c (1 day), each with 200 kB of its own."""
    names = []
    for n, tag in enumerate("abc"):
        pulled = pull_ref(store, image_ref(tmp_path / "src", tag, os.urandom(200_000)))
        set_last_use(store, "image", pulled.manifest.digest.hex,
                     time.time() - (3 - n) * 86400)
        names.append(pulled.name)
    return names


def test_max_size_evicts_least_recently_used_first(store: Store, tmp_path: Path) -> None:
    a, b, c = three_images(store, tmp_path)
    total = run_gc(store, dry_run=True).size_before
    report = run_gc(store, max_size=total - 100_000)  # one image must go: the oldest
    assert removed(report, "ref") == {f"{a} (linux/amd64)"}
    assert ref_names(store) == {b, c}
    assert report.size_after <= total - 100_000 and not report.over_budget
    report = run_gc(store, max_size=report.size_after - 1)
    assert ref_names(store) == {c}
    assert_layout_consistent(store)


def test_max_size_zero_empties_an_unleased_cache(store: Store, tmp_path: Path) -> None:
    three_images(store, tmp_path)
    bundle_ref(store, image_ref(tmp_path / "src", "d", b"d"))
    report = run_gc(store, max_size=0)
    assert ref_names(store) == set() and list_blobs(store) == {} and list_bundles(store) == []
    assert report.size_after == report.size_floor == du(store.root) and not report.over_budget
    index = json.loads((store.root / "index.json").read_text())
    assert index["manifests"] == [] and (store.root / "oci-layout").is_file()


def test_older_than_evicts_only_what_was_not_used_since(store: Store, tmp_path: Path) -> None:
    _a, _b, c = three_images(store, tmp_path)
    run_gc(store, older_than=1.5 * 86400)
    assert ref_names(store) == {c}


def test_a_bundle_is_evicted_on_its_own_last_use(store: Store, tmp_path: Path) -> None:
    made = bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    set_last_use(store, "bundle", made.path.name, time.time() - 5 * 86400)
    report = run_gc(store, older_than=86400.0)
    assert removed(report, "bundle") == {made.path.name}
    assert ref_names(store) == {made.image.name}  # the image was used recently


# -- leases ----------------------------------------------------------------------------------

def test_leases_protect_images_bundles_and_blobs(store: Store, tmp_path: Path) -> None:
    a, _b, _c = three_images(store, tmp_path)
    made = bundle_ref(store, image_ref(tmp_path / "src", "d", b"d"))
    acquire(store.root, f"image:{a}", Holder.pin("keep-a"))
    acquire(store.root, f"bundle:{made.path.name}", Holder.pin("keep-bundle"))
    d_layer = made.image.layers[1].digest
    acquire(store.root, f"blob:{d_layer}", Holder.pin("keep-blob"))
    report = run_gc(store, max_size=0)
    assert ref_names(store) == {a}
    assert made.path.is_dir() and (made.path / "config.json").is_file()
    assert store.has_blob(d_layer)
    assert report.over_budget
    assert {f"image:{a}", f"bundle:{made.path.name}"} <= set(report.protected)
    assert_layout_consistent(store)


def test_a_dead_process_lease_protects_nothing(store: Store, tmp_path: Path) -> None:
    made = bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    mine = acquire(store.root, f"bundle:{made.path.name}", Holder.this_process())
    dead = Lease("d" * 32, f"image:{made.image.name}", dead_pid_holder(), time.time())
    (store.root / "leases" / f"{dead.id}.json").write_text(dead.to_json())
    report = run_gc(store, max_size=0)
    assert removed(report, "lease") == {dead.id}
    assert made.path.is_dir() and ref_names(store) == set()
    assert [lease.id for lease in all_leases(store.root)] == [mine.id]


def test_slurm_job_leases_last_while_the_job_runs(store: Store, tmp_path: Path) -> None:
    made = bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    acquire(store.root, f"bundle:{made.path.name}", Holder.slurm_job("4242"))
    running = collect(store, GcOptions(max_size=0), job_states=lambda ids: {"4242": "RUNNING"})
    assert made.path.is_dir() and running.protected
    unknown = collect(store, GcOptions(max_size=0), job_states=lambda ids: None)
    assert made.path.is_dir() and unknown.protected  # Slurm unreachable: keep
    finished = collect(store, GcOptions(max_size=0), job_states=lambda ids: {})
    assert not made.path.exists() and removed(finished, "bundle") == {made.path.name}
    assert all_leases(store.root) == []


def test_in_use_waits_for_a_running_gc(store: Store, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """protect() writes its lease first, then waits while the GC runs, and returns once the GC
    has ended: seen as the lease on disk, the waiter finding the GC running again and again,
    and protect() returning only after the lock was released (the last check found none)."""
    checks = GcChecks(monkeypatch)
    with gc_lock_held(store.root) as release:
        assert gc_running(store.root)
        done = threading.Event()
        in_use = InUse(store.root)

        def protect() -> None:
            in_use.protect(["image:x"])
            done.set()

        thread = threading.Thread(target=protect)
        thread.start()
        checks.wait_until_waiting()
        assert not done.is_set()
        assert [lease.targets for lease in all_leases(store.root)] == [("image:x",)]
        release()
        assert done.wait(10), "protect() did not return within 10 s of the GC's end"
        thread.join(timeout=10)
        assert checks.answers[-1] is False
        in_use.protect(["image:x", "blob:sha256:" + "a" * 64])
        assert [lease.targets for lease in all_leases(store.root)] == [
            ("image:x", "blob:sha256:" + "a" * 64)]
        in_use.release()
        assert all_leases(store.root) == []


def test_a_gc_lock_of_a_dead_process_is_no_obstacle(store: Store) -> None:
    lock_path = store.root / GC_LOCK
    holder = dead_pid_holder()
    lock_path.write_text(json.dumps({"host": holder.host, "pid": holder.pid, "start": "1"})
                         + "\nabc\n")
    assert not gc_running(store.root)
    report = run_gc(store)
    assert report.removed == () and not lock_path.exists()


def test_budget_after_a_pull_never_takes_what_the_pull_uses(store: Store,
                                                            tmp_path: Path) -> None:
    three_images(store, tmp_path)
    fresh = pull_ref(store, image_ref(tmp_path / "src", "fresh", os.urandom(50_000)),
                     max_size=1)
    assert ref_names(store) == {fresh.name}
    assert fresh.warnings and "over its budget" in fresh.warnings[-1].text
    assert fresh.warnings[-1].kind is Kind.OVER_BUDGET
    made = bundle_ref(store, image_ref(tmp_path / "src", "e", b"e"), max_size=1)
    assert made.path.is_dir() and ref_names(store) == {made.image.name}
    assert made.warnings and "over its budget" in made.warnings[-1].text
    assert made.warnings[-1].kind is Kind.OVER_BUDGET
    assert all_leases(store.root) == []  # the commands' own leases ended with them
    assert_layout_consistent(store)


def test_enforce_budget_skips_while_another_gc_runs(store: Store, tmp_path: Path) -> None:
    three_images(store, tmp_path)
    lock = FileLock(store.root / GC_LOCK)
    lock.acquire()
    try:
        assert enforce_budget(store, 0, job_states=no_jobs) == ()
    finally:
        lock.release()
    assert len(read_refs(store)) == 3


# -- cache rm ----------------------------------------------------------------------------------

def test_rm_drops_the_ref_and_its_own_content_at_once(store: Store, tmp_path: Path) -> None:
    a = bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    b = pull_ref(store, image_ref(tmp_path / "src", "b", b"b"))
    report = remove_ref(store, a.image.name, job_states=no_jobs)
    assert removed(report, "ref") == {f"{a.image.name} (linux/amd64)"}
    assert not a.path.exists() and not store.has_blob(a.image.layers[1].digest)
    assert store.has_blob(b.layers[0].digest)  # shared base stays
    with pytest.raises(NotFound):
        remove_ref(store, a.image.name, job_states=no_jobs)
    with pytest.raises(NotFound):
        remove_ref(store, b.name, platform="linux/arm64", job_states=no_jobs)


def test_a_bundle_stays_while_another_name_caches_its_image(store: Store,
                                                            tmp_path: Path) -> None:
    """``cache rm host-a/x:1`` while ``host-b/x:1`` names the same manifest: its bundle is
    the other name's bundle too (by age, it goes with the last name of its image)."""
    import shutil

    a = image_ref(tmp_path / "src", "a", b"a")
    shutil.copytree(tmp_path / "src" / "a", tmp_path / "other")
    b = f"oci:{tmp_path / 'other'}:a"
    made = bundle_ref(store, a)
    other = pull_ref(store, b)
    assert other.manifest.digest == made.image.manifest.digest
    report = remove_ref(store, made.image.name, job_states=no_jobs)
    assert removed(report, "bundle") == set() and made.path.exists()
    assert removed(run_gc(store), "bundle") == set() and made.path.exists()
    [row] = listing(store).bundles
    assert (row.image, row.names, row.orphan) == (made.image.name, (other.name,), False)
    now = time.time()
    set_last_use(store, "bundle", made.path.name, now)
    set_last_use(store, "image", other.manifest.digest.hex, now - 7200)
    aged = run_gc(store, older_than=3600)
    assert removed(aged, "ref") == {f"{other.name} (linux/amd64)"}
    assert removed(aged, "bundle") == {made.path.name} and not made.path.exists()


def test_rm_refuses_a_leased_image_unless_forced(store: Store, tmp_path: Path) -> None:
    made = bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    name = made.image.name
    acquire(store.root, f"image:{name}", Holder.pin("job"))
    acquire(store.root, f"bundle:{made.path.name}", Holder.pin("job"))
    with pytest.raises(StoreError, match="in use"):
        remove_ref(store, name, job_states=no_jobs)
    assert ref_names(store) == {name}
    remove_ref(store, name, force=True, job_states=no_jobs)
    assert ref_names(store) == set() and made.path.is_dir()  # the leased bundle stays


# -- staged bundles ----------------------------------------------------------------------------

def staged_bundle(where: Path, lease: Lease | None, marker_id: str | None = None) -> Path:
    where.mkdir(parents=True)
    (where / "rootfs" / "ro").mkdir(parents=True)
    (where / "rootfs" / "ro" / "secret").write_text("x")
    (where / "rootfs" / "ro" / "secret").chmod(0)
    (where / "rootfs" / "ro").chmod(0o555)
    (where / "config.json").write_text("{}")
    marker_id = marker_id if marker_id is not None else (lease.id if lease else "")
    (where / ".ocistage-staged.json").write_text(json.dumps({"id": marker_id, "source": "x"}))
    return where


def test_staged_bundle_of_dead_leases_is_removed_by_its_marker(store: Store,
                                                               tmp_path: Path) -> None:
    path = tmp_path / "nodes" / "n1" / "bundle"
    lease = acquire(store.root, f"staged:{path}", Holder.slurm_job("17"))
    older = acquire(store.root, f"staged:{path}", Holder.slurm_job("16"))
    staged_bundle(path, lease)
    (path.parent / "bundle.sqfs").write_bytes(b"squashfs")
    marker = json.loads((path / ".ocistage-staged.json").read_text())
    marker["image"] = "bundle.sqfs"
    (path / ".ocistage-staged.json").write_text(json.dumps(marker))
    alive = collect(store, GcOptions(), job_states=lambda ids: {"17": "RUNNING"})
    assert path.is_dir() and len(all_leases(store.root)) == 2  # one live lease keeps all
    assert removed(alive, "lease") == set()
    report = collect(store, GcOptions(), job_states=lambda ids: {})
    assert removed(report, "staged") == {str(path)}
    assert removed(report, "lease") == {lease.id, older.id}
    assert not path.exists() and not (path.parent / "bundle.sqfs").exists()
    assert all_leases(store.root) == []


@pytest.mark.parametrize("case", ["no-marker", "other-lease", "symlink", "relative-dots"])
def test_staged_paths_not_proven_ours_are_left_alone(store: Store, tmp_path: Path,
                                                     case: str) -> None:
    real = tmp_path / "real"
    path = tmp_path / "staged"
    text = str(path)
    if case == "relative-dots":
        text = f"{tmp_path}/x/../staged"
    lease = acquire(store.root, f"staged:{text}", Holder.slurm_job("5"))
    if case == "symlink":
        staged_bundle(real, lease)
        path.symlink_to(real)
    else:
        staged_bundle(path, lease, marker_id="another" if case == "other-lease" else None)
        if case == "no-marker":
            (path / ".ocistage-staged.json").unlink()
    report = collect(store, GcOptions(), job_states=lambda ids: {})
    assert removed(report, "staged") == set()
    assert removed(report, "lease") == {lease.id}  # dead: dropped, but the files stay
    assert (real if case == "symlink" else path).joinpath("config.json").is_file()
    if case == "symlink":
        assert path.is_symlink()


def test_live_pin_keeps_a_staged_bundle(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "staged"
    staged_bundle(path, acquire(store.root, f"staged:{path}", Holder.pin("stage:me")))
    report = run_gc(store, max_size=0)
    assert path.is_dir() and report.removed == ()


# -- leftovers ---------------------------------------------------------------------------------

def test_leftovers_of_dead_processes_go_and_live_ones_stay(store: Store, tmp_path: Path) -> None:
    holder = dead_pid_holder()
    bundles = store.root / "bundles"
    bundles.mkdir()
    host = socket.gethostname()
    dead_scratch = bundles / f".{'a' * 64}.ocistage-{host}-{holder.pid}-0badc0de"
    (dead_scratch / "rootfs").mkdir(parents=True)
    live_scratch = bundles / scratch_name("b" * 64)
    live_scratch.mkdir()
    dead_tmp = store.tmp_dir / "work-dead"
    dead_tmp.mkdir()
    (store.tmp_dir / "work-dead.owner").write_text(
        json.dumps({"host": host, "pid": holder.pid, "start": "1"}))
    partial = store.ingest_dir / f"{'c' * 64}.partial"
    partial.write_bytes(b"half")
    old_tmp = store.blobs / "sha256" / ".deadbeef.x.tmp"
    young_tmp = store.blobs / "sha256" / ".cafe.y.tmp"
    old_tmp.write_bytes(b"1")
    young_tmp.write_bytes(b"2")
    os.utime(old_tmp, (time.time() - 7200, time.time() - 7200))
    report = run_gc(store)
    assert not dead_scratch.exists() and live_scratch.is_dir()
    assert not dead_tmp.exists() and not partial.exists()
    assert not old_tmp.exists() and young_tmp.exists()
    assert {r.kind for r in report.removed} == {"scratch", "partial", "leftover"}
    assert bundle_scratch_dirs(store) == [live_scratch]


def test_a_partial_being_downloaded_is_left_alone(store: Store) -> None:
    data = os.urandom(1000)
    from ocistage.cache.digest import Digest
    digest = Digest.of_bytes(data)
    with store.ingest(digest, len(data)) as ingest:
        assert isinstance(ingest, Ingest)
        ingest.write(data[:10])
        report = run_gc(store)
        assert removed(report, "partial") == set()
        ingest.write(data[10:])
        ingest.commit()
    assert store.has_blob(digest)


# -- crashes at chosen points ----------------------------------------------------------------

class Crash(Exception):
    """Stands for the process dying at this point."""


def crash_once(monkeypatch: pytest.MonkeyPatch, owner: object, name: str,
               after_calls: int = 0) -> None:
    """Make ``owner.name`` raise Crash on call number ``after_calls + 1``, then behave."""
    original = getattr(owner, name)
    calls = {"n": 0}

    def patched(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == after_calls + 1:
            raise Crash(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, patched)


def crash_creating(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make the first ``os.open`` that creates a file called ``name`` raise Crash: the process
    dies while that file is being unpacked, whichever module unpacks it."""
    original = os.open
    crashed = {"done": False}

    def patched(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if (not crashed["done"] and flags & os.O_CREAT
                and os.path.basename(os.fsdecode(path)) == name):  # type: ignore[arg-type]
            crashed["done"] = True
            raise Crash(f"creating {name}")
        return original(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", patched)


CRASH_POINTS = {
    "mid-blob-write": (Ingest, "write", 0),
    "blob-commit": (Ingest, "commit", 1),
    "before-tag": (Store, "tag", 0),
    "second-layer-extraction": (os, "open", -1),  # creating a.bin, the 2nd layer's file
    "config-written": (bundle_module, "write_bundle_info", 0),
    "bundle-publish-rename": (bundle_module, "fsync_dir", 0),
}


@pytest.mark.parametrize("point", sorted(CRASH_POINTS))
def test_a_crash_in_bundle_leaves_a_cache_the_next_run_completes(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    ref = image_ref(tmp_path / "src", "a", os.urandom(300_000))
    owner, name, after = CRASH_POINTS[point]
    with monkeypatch.context() as patch:
        if after < 0:
            crash_creating(patch, "a.bin")
        else:
            crash_once(patch, owner, name, after)
        with pytest.raises(Crash):
            bundle_ref(store, ref)
    assert all_leases(store.root) == []  # the lease of the crashed command ended
    made = bundle_ref(store, ref)
    assert (made.path / "rootfs" / "base.bin").read_bytes() == BASE
    assert (made.path / "rootfs" / "a.bin").stat().st_size == 300_000
    assert_layout_consistent(store)
    run_gc(store)
    assert [p for p in (store.root / "bundles").iterdir()] == [made.path]
    assert list(store.tmp_dir.iterdir()) == [] and list(store.ingest_dir.iterdir()) == []


@pytest.mark.parametrize("point", ["untag", "bundle-removal", "blob-removal"])
def test_a_crash_in_gc_leaves_a_valid_layout_and_the_next_gc_finishes(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    made = bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    kept = pull_ref(store, image_ref(tmp_path / "src", "b", b"b"))
    set_last_use(store, "image", made.image.manifest.digest.hex, time.time() - 86400)
    set_last_use(store, "bundle", made.path.name, time.time() - 86400)
    import ocistage.cache.evict as evict_module
    target: tuple[object, str, int] = {
        "untag": (Store, "untag", 0),
        "bundle-removal": (evict_module, "remove_at", 0),
        "blob-removal": (os, "unlink", 0),
    }[point]
    with monkeypatch.context() as patch:
        crash_once(patch, *target)
        with pytest.raises(Crash):
            run_gc(store, older_than=3600.0)
    assert_layout_consistent(store)
    assert not (store.root / GC_LOCK).exists()
    run_gc(store, older_than=3600.0)
    assert ref_names(store) == {kept.name}
    assert list_bundles(store) == [] and list(store.tmp_dir.iterdir()) == []
    assert set(list_blobs(store)) == {kept.manifest.digest, kept.config_digest,
                                      *(layer.digest for layer in kept.layers)}


@pytest.fixture(autouse=True)
def _no_stray_gc_lock(store: Store) -> Iterator[None]:
    yield
    assert not (store.root / GC_LOCK).exists()


# -- accounting: what GC says it frees is what du sees ---------------------------------------

def linked_images(store: Store, tmp_path: Path) -> list[BundleResult]:
    """Images a, b, c, each with a cached bundle (hard links into its snapshot) and 300 kB of
    its own; a's snapshot is the least recently used entry, then a, b, c."""
    made = []
    now = time.time()
    for n, tag in enumerate("abc"):
        result = bundle_ref(store, image_ref(tmp_path / "src", tag, os.urandom(300_000)))
        set_last_use(store, "image", result.image.manifest.digest.hex, now - (3 - n) * 3600)
        set_last_use(store, "bundle", result.path.name, now - (3 - n) * 3600)
        made.append(result)
    chain_a = chain_ids(made[0].image.config.diff_ids)[-1]
    snapshot_json = store.root / "snapshots" / chain_a.hex / "snapshot.json"
    assert snapshot_json.exists()
    os.utime(snapshot_json, (now - 86400, now - 86400))
    return made


def assert_accounting_matches_du(store: Store, budget: int | None, **options: object) -> GcReport:
    """A dry run, then the real run: the same entries and sizes; both sizes as `du` shows them;
    the removals inside the cache add up to what the cache shrank by."""
    before = du(store.root)
    dry = run_gc(store, max_size=budget, dry_run=True, **options)
    assert du(store.root) == before
    real = run_gc(store, max_size=budget, **options)
    after = du(store.root)
    assert [(r.kind, r.name, r.size) for r in dry.removed] == \
        [(r.kind, r.name, r.size) for r in real.removed]
    assert (real.size_before, real.size_after) == (dry.size_before, dry.size_after)
    assert (real.size_before, real.size_after) == (before, after)
    assert sum(r.size for r in real.removed if r.kind != "staged") == before - after
    assert real.over_budget == (budget is not None and after > max(budget, real.size_floor))
    return real


def test_an_evicted_snapshot_that_a_kept_bundle_links_frees_only_its_own_blocks(
        store: Store, tmp_path: Path) -> None:
    a, _, _ = linked_images(store, tmp_path)
    before = du(store.root)
    report = assert_accounting_matches_du(store, before - 200_000)
    snapshot = next(r for r in report.removed if r.kind == "snapshot")
    assert snapshot.reason == "least recently used"
    # its 300 kB file is still linked by a's bundle: evicting the snapshot alone frees
    # directories, so GC had to go on (a's image and bundle) to get under the budget
    assert snapshot.size < 100_000
    assert removed(report, "bundle") == {a.path.name}
    assert report.size_after <= before - 200_000 and not report.over_budget


def test_gc_sizes_agree_with_du_at_every_budget(store: Store, tmp_path: Path) -> None:
    """On copies of one cache (bundles, snapshots, a linked DEST outside, a leased image, a
    dead partial download and scratch dir): every budget, the dry run lists what the real
    run removes, and both agree with du before and after."""
    made = linked_images(store, tmp_path)
    bundle_ref(store, image_ref(tmp_path / "src", "d", os.urandom(50_000)), tmp_path / "dest")
    acquire(store.root, f"image:{made[2].image.name}", Holder.pin("keep-c"))
    (store.ingest_dir / f"{'e' * 64}.partial").write_bytes(os.urandom(700_000))
    total = du(store.root)
    for n, budget in enumerate((None, total, total * 3 // 4, total // 2, total // 4, 0)):
        copy = tmp_path / f"copy{n}"
        subprocess.run(["cp", "-a", str(store.root), str(copy)], check=True)
        report = assert_accounting_matches_du(Store.open(copy), budget)
        if budget == 0:
            assert report.over_budget and report.protected
        assert any(r.kind == "partial" and r.size >= 700_000 for r in report.removed)


def test_a_partial_download_counts_at_its_size_on_disk(store: Store, tmp_path: Path) -> None:
    """An abandoned 5 MiB download (a real Ingest, as an out-of-space pull leaves it) is in
    the size before and in what GC says it freed."""
    data = os.urandom(5 << 20)
    digest = Digest.of_bytes(data + b"the rest never came")
    with pytest.raises(OSError), store.ingest(digest, len(data) + 19) as ingest:
        assert ingest is not None
        ingest.write(data)
        raise OSError(28, "No space left on device")
    partial = store.ingest_dir / f"{digest.hex}.partial"
    assert partial.stat().st_size == len(data)
    report = assert_accounting_matches_du(store, None)
    assert [(r.kind, r.name) for r in report.removed] == [("partial", str(partial))]
    assert report.removed[0].size >= len(data)
    assert report.size_before - report.size_after == report.removed[0].size


def test_evicting_one_platform_of_three_leaves_an_index_of_two_and_du_agrees(
        store: Store) -> None:
    """REF's alias is rewritten to an index of the platforms that stay; GC stores that index
    first, keeps it, and counts it (and index.json's new size) as du does."""
    name = NAMES[0]
    now = time.time()
    for p in range(3):
        resolved = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - (3 - p) * 86400))
        store.tag(name, {**manifest(store, p), "platform": PLATFORMS[p],
                         "annotations": {"io.ocistage.resolved": resolved}})
    report = assert_accounting_matches_du(store, None, older_than=2.5 * 86400)
    assert removed(report, "ref") == {f"{name} (linux/amd64)"}
    check_names(store, {(name, 1): 1, (name, 2): 2})
    assert_layout_consistent(store)


# -- quarantine: counted, freed under pressure, private -----------------------------------------

def test_quarantine_counts_against_the_budget_and_goes_first_under_pressure(
        store: Store, tmp_path: Path) -> None:
    """Quarantine is kept a week for a post-mortem, but not at the price of a full cache:
    it counts against the budget and is the first thing gc frees under pressure (in a soak,
    1 GB of it filled a 1.5 GiB cache while gc freed nothing). Its directory is as private
    as a snapshot's: what it holds is an image's files."""
    made = bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    aside = store.root / "bundles" / "aside"
    aside.mkdir()
    (aside / "data").write_bytes(os.urandom(400_000))
    moved = quarantine(store, aside, "bundle")
    assert stat.S_IMODE(os.stat(store.root / "quarantine").st_mode) == 0o700
    assert run_gc(store).removed == ()  # younger than a week, no budget: kept
    size = run_gc(store, dry_run=True).size_before
    report = run_gc(store, max_size=size - 100_000)
    assert removed(report, "quarantine") == {str(moved)}
    assert not moved.exists() and made.path.exists()  # it went instead of the bundle
    assert not report.over_budget


def test_an_evicted_tree_of_ours_is_removed_once_and_a_dry_run_says_so_once(
        store: Store) -> None:
    """A tree a removal left under its evicted name (``.evicted-NAME-RAND`` beside where it
    was): the next command that opens the cache removes it; gc's dry run lists it once, with
    the size the real run frees."""
    evicted = store.root / "bundles" / ".evicted-k-0123abcd"
    (evicted / "rootfs").mkdir(parents=True)
    (evicted / "rootfs" / "data").write_bytes(os.urandom(100_000))
    dry = run_gc(store, dry_run=True)
    assert [(r.kind, r.name) for r in dry.removed] == [("scratch", str(evicted))]
    assert dry.left == ()
    real = run_gc(store)
    assert [(r.name, r.size) for r in real.removed] == [(r.name, r.size) for r in dry.removed]
    assert not evicted.exists()
    evicted.mkdir()
    Store.open(store.root)  # the owner's next command
    assert not evicted.exists()
