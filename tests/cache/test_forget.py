"""forget: a ref and the blobs only it reached go, under the GC lock; shared, leased and
alias-named blobs stay, a leased ref stays whole, and the cache verifies clean after. Pulls
that lease before or after the removal read the leases are seen or wait, with the real lease
files and the real GC lock held by another process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.pull import PulledImage, ref_name
from ocistage.cache.digest import Digest
from ocistage.cache.forget import Forgotten, forget
from ocistage.cache.inventory import list_blobs, read_refs
from ocistage.cache.leases import GC_LOCK, Holder, InUse, Lease, acquire, all_leases
from ocistage.cache.store import Store
from ocistage.cache.verify import verify
from tests.bundler.tarbuilder import build_tar, file, write_oci_layout
from tests.cache.gclock import GcChecks, gc_lock_held
from tests.cache.test_gc import dead_pid_holder, no_jobs
from tests.cache.test_inventory import image_ref, pull_ref
from tests.cache.test_refnames import NAMES, PLATFORMS, manifest
from tests.groupcache import group_cache_members


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "cache")


def blobs_of(image: PulledImage) -> set[Digest]:
    return {image.manifest.digest, image.config_digest, *(layer.digest for layer in image.layers)}


def two_images(store: Store, tmp_path: Path) -> tuple[PulledImage, PulledImage]:
    """Two pulled images sharing their base layer."""
    a = pull_ref(store, image_ref(tmp_path / "src", "a", os.urandom(4096)))
    b = pull_ref(store, image_ref(tmp_path / "src", "b", os.urandom(4096)))
    return a, b


def test_the_ref_and_its_own_blobs_go_a_shared_one_stays(store: Store, tmp_path: Path) -> None:
    a, b = two_images(store, tmp_path)
    done = forget(store, a.name, job_states=no_jobs)
    assert done.records == 1 and not done.leased
    assert set(done.blobs) == blobs_of(a) - blobs_of(b)
    assert store.lookup(a.name) == []
    assert set(list_blobs(store)) == blobs_of(b)  # the shared base stays with b
    assert [ref.name for ref in read_refs(store)] == [b.name]
    assert verify(store).ok
    assert not (store.root / GC_LOCK).exists()  # released


def test_a_ref_not_in_the_cache_is_nothing_to_do(store: Store, tmp_path: Path) -> None:
    a, _b = two_images(store, tmp_path)
    before = set(list_blobs(store))
    assert forget(store, "docker.io/library/absent:1", job_states=no_jobs).records == 0
    assert forget(store, a.name, job_states=no_jobs).records == 1
    assert forget(store, a.name, job_states=no_jobs).records == 0
    assert set(list_blobs(store)) < before and verify(store).ok


def test_a_leased_blob_stays_and_a_dead_lease_keeps_nothing(store: Store, tmp_path: Path) -> None:
    a, _b = two_images(store, tmp_path)
    own = a.layers[1].digest
    acquire(store.root, f"blob:{own}", Holder.pin("keep-layer"))
    dead = Lease("d" * 32, f"blob:{a.config_digest}", dead_pid_holder(), time.time())
    (store.root / "leases" / f"{dead.id}.json").write_text(dead.to_json())
    done = forget(store, a.name, job_states=no_jobs)
    assert store.lookup(a.name) == [] and own not in done.blobs
    assert store.has_blob(own)  # an orphan the next gc removes once its lease has ended
    assert not store.has_blob(a.config_digest) and not store.has_blob(a.manifest.digest)
    assert verify(store).ok


def test_a_leased_ref_stays_whole(store: Store, tmp_path: Path) -> None:
    a, _b = two_images(store, tmp_path)
    before = set(list_blobs(store))
    acquire(store.root, f"image:{a.name}", Holder.slurm_job("4242"))
    done = forget(store, a.name, job_states=lambda ids: {"4242": "RUNNING"})
    assert done.leased and done.records == 0 and done.blobs == ()
    assert len(store.lookup(a.name)) == 1 and set(list_blobs(store)) == before
    unknown = forget(store, a.name, job_states=lambda ids: None)  # Slurm unreachable: keep
    assert unknown.leased and set(list_blobs(store)) == before
    ended = forget(store, a.name, job_states=lambda ids: {})
    assert ended.records == 1 and store.lookup(a.name) == [] and verify(store).ok


def test_an_index_another_alias_names_stays(store: Store) -> None:
    """Two names with the same platforms' manifests have aliases naming one index document:
    forgetting one name leaves the other's alias, its index and the manifests whole; the
    last name takes them all."""
    first, second = NAMES[0], NAMES[2]
    for name in (first, second):
        for p in (0, 1):
            store.tag(name, {**manifest(store, p), "platform": PLATFORMS[p]})
    [alias] = [e for e in store.read_index() if e["annotations"].get(
        "org.opencontainers.image.ref.name") == second]
    index = Digest.parse(alias["digest"])
    assert store.has_blob(index)
    assert forget(store, first, job_states=no_jobs).records == 2
    assert store.has_blob(index)
    assert all(ref.missing == () for ref in read_refs(store))
    assert {ref.name for ref in read_refs(store)} == {second}
    assert forget(store, second, job_states=no_jobs).records == 2
    assert list_blobs(store) == {} and store.read_index() == []


def test_a_pull_that_leased_while_forget_waited_for_a_gc_is_seen(store: Store,
                                                                 tmp_path: Path) -> None:
    """A lease recorded before forget holds the GC lock (here: while another process's gc
    holds it, and forget waits) keeps the ref: forget reads the leases only once it holds
    the lock."""
    a, _b = two_images(store, tmp_path)
    before = set(list_blobs(store))
    result: list[object] = []
    with gc_lock_held(store.root) as release:
        waiting = threading.Thread(
            target=lambda: result.append(forget(store, a.name, lock_timeout=60,
                                                job_states=no_jobs)))
        waiting.start()
        lease = acquire(store.root, f"image:{a.name}", Holder.this_process())
        release()
        waiting.join(timeout=60)
    assert not waiting.is_alive()
    [done] = result
    assert isinstance(done, Forgotten) and done.leased
    assert len(store.lookup(a.name)) == 1 and set(list_blobs(store)) == before
    assert [x.id for x in all_leases(store.root)] == [lease.id]


def test_a_pull_that_leases_after_forget_read_the_leases_waits_and_pulls_again(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """forget runs in another process and stops, holding the GC lock, once it has read the
    leases (a Slurm job's lease on another blob makes it ask for job states: the test's
    answer waits for a line). A pull that records its lease then waits for the lock, and
    looks once forget is done: the ref and its own blobs are gone, and it pulls them again."""
    source = image_ref(tmp_path / "src", "a", os.urandom(4096))
    a = pull_ref(store, source)
    acquire(store.root, f"blob:sha256:{'0' * 64}", Holder.slurm_job("7"))
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from ocistage.cache.forget import Forgotten, forget
        from ocistage.cache.store import Store

        def job_states(ids):
            print("leases read", flush=True)
            sys.stdin.readline()
            return {{}}

        done = forget(Store.open(Path({str(store.root)!r})), {a.name!r}, lock_timeout=60,
                      job_states=job_states)
        print(done.records, len(done.blobs), flush=True)
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "leases read"
        checks = GcChecks(monkeypatch)
        in_use = InUse(store.root)
        protected = threading.Event()

        def lease() -> None:
            in_use.protect([f"image:{a.name}", *(f"blob:{d}" for d in blobs_of(a))])
            protected.set()

        thread = threading.Thread(target=lease)
        thread.start()
        checks.wait_until_waiting()
        assert not protected.is_set()  # the lease is recorded, the pull waits for the lock
        child.stdin.write("\n")
        child.stdin.flush()
        assert protected.wait(30), "the pull still waits 30 s after forget was let go"
        thread.join(timeout=30)
        assert child.stdout.readline().split() == ["1", str(len(blobs_of(a)))]
        assert store.lookup(a.name) == [] and not store.has_blob(a.config_digest)
        again = pull_ref(store, source)
        assert again.fetched_bytes > 0 and blobs_of(again) == blobs_of(a)
        in_use.release()
    finally:
        child.kill()
        child.wait()
    assert verify(store).ok


@pytest.mark.needs_root("two members of a group-shared cache are users made here")
def test_a_member_leaves_the_blobs_it_may_not_unlink_to_the_next_gc(tmp_path: Path) -> None:
    """In a group-shared cache whose blob directory is sticky (only a blob's owner may
    unlink it), member B's forget of a ref member A pulled untags it and leaves A's blobs:
    no error, a cache that verifies clean, and A's next gc removes them as orphans."""
    with group_cache_members() as g:
        layout = g.base / "layout"
        write_oci_layout(layout, [build_tar([file("a.bin", os.urandom(4096))])], tag="t")
        source = f"oci:{layout}:t"
        g.run(g.a, "pull", source)
        (g.cache / "blobs" / "sha256").chmod(0o3775)
        name = ref_name(parse_reference(source))
        script = textwrap.dedent(f"""
            from ocistage.cache.forget import forget
            from ocistage.cache.store import Store
            done = forget(Store.open({str(g.cache)!r}), {name!r}, job_states=lambda ids: {{}})
            print(done.records, len(done.blobs))
            """)
        out = g.run(g.b, "-c", script, program=(sys.executable,)).stdout
        assert out.split() == ["1", "0"]
        assert '"manifests": []' in (g.cache / "index.json").read_text()
        assert g.entries("blobs/sha256")  # A's, left
        g.run(g.a, "cache", "verify")
        g.gc(g.a)
        assert g.entries("blobs/sha256") == {}
