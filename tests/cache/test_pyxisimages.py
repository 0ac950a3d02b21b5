"""``cache gc|ls|du`` and the squashfs images of ocistage-pyxis-importer: evicted like refs and
bundles (least recently used, or older than an age), never while a live process or job holds
one; their records, notes and dead builders' locks go with them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ocistage.bundler.pyxis.imagekey import image_key
from ocistage.bundler.pyxis.imagestore import ImageStore
from ocistage.bundler.pyxis.jobstep import JobStep
from ocistage.bundler.pyxis.uri import parse_enroot_uri as uri
from ocistage.cache import leases, pyxisimages, usage
from ocistage.cache.diskusage import disk_usage
from ocistage.cache.gc import GcOptions, GcReport, collect
from ocistage.cache.listing import listing
from ocistage.cache.locks import Owner
from ocistage.cache.store import Store
from tests.cache.test_gc import dead_pid_holder, du, removed

SIZE = 256 << 10


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "cache")


def make_image(store: Store, name: str, used: float) -> str:
    """An image published as the importer publishes it, its reference noted, last used at
    ``used``; returns its key."""
    manifest = "sha256:" + name.encode().hex().ljust(64, "0")[:64]
    key = image_key(manifest, "zstd")
    scratch = store.temp_dir("pyxis")
    built = scratch / "img"
    built.write_bytes(os.urandom(SIZE))
    (store.root / "pyxis").mkdir(exist_ok=True)
    ImageStore(store.root).publish(built, key, {"source": f"reg.io/{name}:1", "manifest": manifest})
    store.remove_temp_dir(scratch)
    ImageStore(store.root).remember(uri(f"docker://reg.io#{name}:1").reference, key, manifest)
    assert pyxisimages.touch(store.root, key)
    usage_file = usage.usage_path(store.root, "squashfs", key)
    os.utime(usage_file, (used, used))
    return key


def gc(store: Store, jobs: dict[str, str] | None = None, **options: object) -> GcReport:
    return collect(store, GcOptions(**options),  # type: ignore[arg-type]
                   job_states=lambda ids: dict(jobs or {}))


def keys(store: Store) -> set[str]:
    return {image.key for image in pyxisimages.list_images(store.root)}


def pyxis_files(store: Store) -> list[str]:
    return sorted(str(p.relative_to(store.root / "pyxis"))
                  for p in (store.root / "pyxis").rglob("*") if p.is_file())


def test_gc_without_eviction_keeps_images(store: Store) -> None:
    key = make_image(store, "a", time.time() - 86400)
    report = gc(store)
    assert removed(report, "squashfs") == set() and keys(store) == {key}


def test_older_than_evicts_unleased_images_with_everything_of_theirs(store: Store) -> None:
    now = time.time()
    old = make_image(store, "old", now - 3 * 86400)
    new = make_image(store, "new", now - 60)
    before = pyxis_files(store)
    notes = {name: json.loads((store.root / "pyxis" / name).read_text())["key"]
             for name in before if name.startswith("refs/")}
    report = gc(store, older_than=86400.0)
    assert removed(report, "squashfs") == {old}
    assert keys(store) == {new}
    assert not ImageStore(store.root).path(old).exists()
    gone = set(before) - set(pyxis_files(store))
    assert gone == {f"{old}.sqsh", f"{old}.json",
                    *(name for name, key in notes.items() if key == old)}
    assert len([n for n in pyxis_files(store) if n.startswith("refs/")]) == 1
    assert not usage.usage_path(store.root, "squashfs", old).exists()
    freed = sum(r.size for r in report.removed if r.kind == "squashfs")
    assert freed >= SIZE
    assert report.size_after == du(store.root)


def test_max_size_evicts_least_recently_used_first(store: Store) -> None:
    now = time.time()
    first = make_image(store, "first", now - 300)
    second = make_image(store, "second", now - 200)
    third = make_image(store, "third", now - 100)
    report = gc(store, max_size=du(store.root) - SIZE)
    assert removed(report, "squashfs") == {first}
    assert keys(store) == {second, third}
    assert report.size_after == du(store.root) and not report.over_budget


def test_a_live_process_lease_keeps_an_image_a_dead_one_does_not(store: Store) -> None:
    old = time.time() - 30 * 86400
    kept = make_image(store, "kept", old)
    orphan = make_image(store, "orphan", old)
    leases.acquire(store.root, pyxisimages.squashfs_target(kept), leases.Holder.this_process())
    leases.acquire(store.root, pyxisimages.squashfs_target(orphan), dead_pid_holder())
    report = gc(store, max_size=0, older_than=0.0)
    assert keys(store) == {kept}
    assert removed(report, "squashfs") == {orphan}
    assert f"squashfs:{kept}" in report.protected
    assert report.over_budget


def test_a_running_job_keeps_its_image_until_it_ends(store: Store) -> None:
    key = make_image(store, "job", time.time() - 30 * 86400)
    JobStep("42", "0").hold(store.root, key)
    report = gc(store, jobs={"42": "RUNNING"}, older_than=0.0)
    assert keys(store) == {key} and report.protected == (f"squashfs:{key}",)
    report = gc(store, jobs={"42": "COMPLETED"}, older_than=0.0)
    assert keys(store) == set()
    assert removed(report, "lease") and removed(report, "squashfs") == {key}


def test_a_released_step_frees_the_image(store: Store) -> None:
    key = make_image(store, "rel", time.time() - 30 * 86400)
    step = JobStep(None, "none")  # outside a job: a pin, live until released
    step.hold(store.root, key)
    assert gc(store, older_than=0.0).protected == (f"squashfs:{key}",)
    assert step.release([store.root]) == 1
    assert removed(gc(store, older_than=0.0), "squashfs") == {key}


def test_dry_run_lists_the_same_removals_and_removes_nothing(store: Store) -> None:
    key = make_image(store, "dry", time.time() - 30 * 86400)
    files = pyxis_files(store)
    dry = gc(store, dry_run=True, older_than=0.0)
    assert pyxis_files(store) == files
    real = gc(store, older_than=0.0)
    assert [(r.kind, r.name, r.size) for r in dry.removed] == \
           [(r.kind, r.name, r.size) for r in real.removed]
    assert removed(real, "squashfs") == {key}


def test_strays_and_dead_build_locks_go(store: Store) -> None:
    key = make_image(store, "k", time.time())
    directory = store.root / "pyxis"
    stray = directory / f"{'f' * 64}.json"       # a publish cut between its renames
    stray.write_text('{"source": "x"}')
    dead = Owner(Owner.me().host, dead_pid_holder().pid or 1, "1")
    lock = directory / f"{'e' * 64}.lock"       # a build killed with -9
    lock.write_text(dead.to_json() + "\ntoken\n")
    live = directory / f"{'d' * 64}.lock"       # a build running now
    live.write_text(Owner.me().to_json() + "\ntoken\n")
    note = directory / "refs" / ("0" * 64 + ".json")
    note.write_text(json.dumps({"key": "c" * 64}))
    report = gc(store)
    assert {Path(r.name) for r in report.removed if r.kind in ("leftover", "scratch")} >= {
        stray, lock, note}
    assert not stray.exists() and not lock.exists() and not note.exists()
    assert live.exists() and keys(store) == {key}


def test_ls_and_du_show_images_and_their_leases(store: Store) -> None:
    key = make_image(store, "shown", time.time() - 10)
    JobStep("7", "1").hold(store.root, key)
    rows = listing(store, job_states=lambda ids: {"7": "RUNNING"}).squashfs
    assert [(r.key, r.source) for r in rows] == [(key, "reg.io/shown:1")]
    assert [lease.holder for lease in rows[0].leases] == ["job 7"] and rows[0].leases[0].live
    assert rows[0].disk >= SIZE and rows[0].last_used == pytest.approx(time.time() - 10, abs=5)
    part = disk_usage(store).squashfs
    assert part.count == 1 and part.disk >= SIZE and part.logical >= SIZE
    assert part.disk == du(store.root / "pyxis")


# -- a store users only read: retired first, removed a grace later (docs/site.md) ---------------

def test_in_a_store_users_only_read_an_evicted_image_is_retired_then_removed(
        store: Store) -> None:
    """Users of a site's store leave no lease there: gc removed an image a job had just been
    handed (between its get and pyxis opening it). Now it is retired, handed out no more,
    and removed by a gc once RETIRE_GRACE has passed."""
    from ocistage.bundler.pyxis.sitestore import SiteStore

    now = time.time()
    key = make_image(store, "site", now - 3 * 86400)
    site = SiteStore(store.root)
    assert site.image(key) is not None
    dry = gc(store, older_than=86400.0, retire_images=True, dry_run=True)
    assert removed(dry, "squashfs") == {key} and pyxisimages.retired_since(store.root, key) is None
    report = gc(store, older_than=86400.0, retire_images=True)
    assert removed(report, "squashfs") == {key}
    assert [r.size for r in report.removed if r.kind == "squashfs"] == [0]
    assert "retired" in next(r.reason for r in report.removed if r.kind == "squashfs")
    assert keys(store) == {key} and ImageStore(store.root).path(key).is_file()
    assert site.image(key) is None  # no get hands it out any more
    assert site.recalled(uri("docker://reg.io#site:1").reference) is None
    assert removed(gc(store, older_than=86400.0, retire_images=True), "squashfs") == set()
    marker = pyxisimages.retired_path_at(store.root, key)
    past = now - pyxisimages.RETIRE_GRACE - 1
    os.utime(marker, (past, past))
    later = gc(store)  # no eviction asked: a retired image goes once its grace has passed
    assert removed(later, "squashfs") == {key} and keys(store) == set()
    assert pyxis_files(store) == []
    assert later.size_after == du(store.root)


def test_a_retired_image_leased_again_by_a_get_of_the_stores_owner_stays(store: Store) -> None:
    now = time.time()
    key = make_image(store, "again", now - 3 * 86400)
    gc(store, older_than=86400.0, retire_images=True)
    marker = pyxisimages.retired_path_at(store.root, key)
    past = now - pyxisimages.RETIRE_GRACE - 1
    os.utime(marker, (past, past))
    step = JobStep(None, "none")
    assert ImageStore(store.root).recalled(uri("docker://reg.io#again:1").reference, step)
    assert not marker.exists()
    assert removed(gc(store), "squashfs") == set() and keys(store) == {key}


def test_without_retire_images_an_evicted_image_goes_at_once(store: Store) -> None:
    key = make_image(store, "mine", time.time() - 3 * 86400)
    assert removed(gc(store, older_than=86400.0), "squashfs") == {key}
    assert keys(store) == set()
