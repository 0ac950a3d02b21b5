"""`cache verify`: corrupt blobs and foreign files are quarantined, refs that needed them are
dropped (so the next pull fetches them again), broken bundles are moved aside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocistage.cache.inventory import list_blobs, list_bundles, read_refs
from ocistage.cache.store import Store
from ocistage.cache.verify import verify
from tests.cache.test_inventory import bundle_ref, image_ref, pull_ref


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "cache")


def flip_byte(path: Path, offset: int) -> None:
    path.chmod(0o644)
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0xFF]))
    path.chmod(0o444)


def quarantined(store: Store) -> list[str]:
    directory = store.root / "quarantine"
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_a_clean_cache_verifies(store: Store, tmp_path: Path) -> None:
    bundle_ref(store, image_ref(tmp_path / "src", "a", os.urandom(5000)))
    report = verify(store)
    assert report.ok and report.problems == ()
    assert report.blobs == 4 and report.refs == 1 and report.bundles == 1
    assert report.bytes == sum(b.size for b in list_blobs(store).values())


def test_a_flipped_byte_is_quarantined_and_its_ref_dropped(store: Store, tmp_path: Path) -> None:
    ref_a = image_ref(tmp_path / "src", "a", os.urandom(5000))
    a = pull_ref(store, ref_a)
    b = pull_ref(store, image_ref(tmp_path / "src", "b", os.urandom(5000)))
    layer = a.layers[1].digest
    flip_byte(store.blob_path(layer), 100)
    report = verify(store)
    assert not report.ok
    kinds = {(p.kind, p.name) for p in report.problems}
    assert kinds == {("corrupt-blob", str(layer)), ("broken-ref", f"{a.name} (linux/amd64)")}
    corrupt = next(p for p in report.problems if p.kind == "corrupt-blob")
    assert "quarantine" in corrupt.action and str(layer) not in corrupt.detail
    assert not store.has_blob(layer)
    assert [name.startswith("blob-") for name in quarantined(store)] == [True]
    assert {ref.name for ref in read_refs(store)} == {b.name}
    again = pull_ref(store, ref_a)  # the next pull fetches what was lost
    assert again.fetched_bytes > 0 and store.has_blob(layer)
    assert verify(store).ok


def test_a_shared_corrupt_layer_drops_every_ref_that_needs_it(store: Store,
                                                              tmp_path: Path) -> None:
    a = pull_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    pull_ref(store, image_ref(tmp_path / "src", "b", b"b"))
    flip_byte(store.blob_path(a.layers[0].digest), 0)  # the shared base layer
    report = verify(store)
    assert sum(p.kind == "broken-ref" for p in report.problems) == 2
    assert read_refs(store) == []


def test_dry_run_reports_without_touching(store: Store, tmp_path: Path) -> None:
    a = pull_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    flip_byte(store.blob_path(a.config_digest), 3)
    report = verify(store, dry_run=True)
    assert {p.kind for p in report.problems} == {"corrupt-blob", "broken-ref"}
    assert all(p.action == "none (dry run)" for p in report.problems)
    assert store.has_blob(a.config_digest) and len(read_refs(store)) == 1
    assert quarantined(store) == []


def test_foreign_files_and_broken_bundles_are_moved_aside(store: Store, tmp_path: Path) -> None:
    made = bundle_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    (store.blobs / "sha256" / "not-a-digest").write_text("junk")
    (store.blobs / "md5").mkdir()
    leftover = store.blobs / "sha256" / ".abc.tmp"  # an interrupted write: not corruption
    leftover.write_text("partial")
    (made.path / "config.json").write_text("{not json")
    report = verify(store)
    assert {(p.kind, p.name) for p in report.problems} == {
        ("foreign-file", "blobs/sha256/not-a-digest"), ("foreign-file", "blobs/md5"),
        ("broken-bundle", made.path.name)}
    assert list_bundles(store) == [] and leftover.exists()
    assert len(quarantined(store)) == 3
    assert len(read_refs(store)) == 1  # the image itself is fine
    assert verify(store).ok


def test_a_missing_blob_breaks_its_ref(store: Store, tmp_path: Path) -> None:
    a = pull_ref(store, image_ref(tmp_path / "src", "a", b"a"))
    os.unlink(store.blob_path(a.layers[1].digest))
    report = verify(store)
    [problem] = report.problems
    assert problem.kind == "broken-ref" and str(a.layers[1].digest) in problem.detail
    assert read_refs(store) == []
