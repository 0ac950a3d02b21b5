"""index.json names: whatever is tagged and untagged, every ref.name names one descriptor, a
ref's plain name names its one platform's manifest or an index of all its platforms, and a
cache written before (every platform named REF) is read and renamed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocistage.cache.digest import Digest
from ocistage.cache.inventory import read_refs
from ocistage.cache.refnames import ANNOTATION_PLATFORMS, INDEX_MEDIA_TYPE, REF_NAME
from ocistage.cache.store import Store

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
PLATFORMS = ({"os": "linux", "architecture": "amd64"},
             {"os": "linux", "architecture": "arm64", "variant": "v8"},
             {"os": "linux", "architecture": "ppc64le"})
NAMES = ("reg:5000/multi:latest", "reg:5000/multi@sha256:" + "a" * 64, "docker.io/library/x:1")


def manifest(store: Store, n: int) -> dict[str, object]:
    data = json.dumps({"schemaVersion": 2, "n": n}).encode()
    digest = store.put_blob(data)
    return {"mediaType": MANIFEST, "digest": str(digest), "size": len(data)}


def names_and_targets(store: Store) -> dict[str, dict[str, object]]:
    entries = store.read_index()
    names = [e["annotations"][REF_NAME] for e in entries]
    assert len(names) == len(set(names)), names  # one ref.name, one descriptor
    return {e["annotations"][REF_NAME]: e for e in entries}


def check(store: Store, expected: dict[tuple[str, int], int]) -> None:
    """index.json against ``expected`` ((name, platform number) -> manifest number)."""
    entries = names_and_targets(store)
    for name in NAMES:
        platforms = {p: m for (n, p), m in expected.items() if n == name}
        records = store.lookup(name)
        assert sorted(str(r["digest"]) for r in records) == sorted(
            str(manifest(store, m)["digest"]) for m in platforms.values())
        for p, m in platforms.items():
            qualified = entries[f"{name}+{'/'.join(PLATFORMS[p].values())}"]
            assert qualified["digest"] == manifest(store, m)["digest"]
            assert qualified["platform"] == PLATFORMS[p]
        alias = entries.get(name)
        if not platforms:
            assert alias is None
            continue
        assert alias is not None
        annotations = alias["annotations"]
        assert isinstance(annotations, dict) and ANNOTATION_PLATFORMS in annotations
        if len(platforms) == 1:
            (m,) = platforms.values()
            assert alias["digest"] == manifest(store, m)["digest"]
            continue
        assert alias["mediaType"] == INDEX_MEDIA_TYPE
        index = json.loads(store.read_blob(Digest.parse(str(alias["digest"]))))
        assert {(c["digest"], json.dumps(c["platform"], sort_keys=True))
                for c in index["manifests"]} == {
            (manifest(store, m)["digest"], json.dumps(PLATFORMS[p], sort_keys=True))
            for p, m in platforms.items()}
    refs = read_refs(store)
    assert sorted((r.name, r.platform) for r in refs) == sorted(
        (n, "/".join(PLATFORMS[p].values())) for n, p in expected)
    assert all(r.missing == () for r in refs)


operations = st.lists(st.tuples(st.booleans(), st.sampled_from(range(len(NAMES))),
                                st.sampled_from(range(len(PLATFORMS))),
                                st.integers(0, 3)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(operations)
def test_every_name_names_one_descriptor(tmp_path_factory: pytest.TempPathFactory,
                                         ops: list[tuple[bool, int, int, int]]) -> None:
    store = Store.open(tmp_path_factory.mktemp("cache"))
    expected: dict[tuple[str, int], int] = {}
    for tag, n, p, m in ops:
        name = NAMES[n]
        if tag:
            store.tag(name, {**manifest(store, m), "platform": PLATFORMS[p],
                             "annotations": {"io.ocistage.resolved": "x"}})
            expected[(name, p)] = m
        else:
            def chosen(entry: dict[str, Any], name: str = name, p: int = p) -> bool:
                return (entry.get("platform") == PLATFORMS[p]
                        and entry["annotations"].get("io.ocistage.ref") == name)

            store.untag(chosen)
            expected.pop((name, p), None)
        check(store, expected)


def test_a_cache_of_before_is_read_and_renamed_by_the_next_tag(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    name = NAMES[0]
    old = [{**manifest(store, p), "platform": PLATFORMS[p],
            "annotations": {REF_NAME: name, "io.ocistage.resolved": "x"}} for p in (0, 1)]
    (store.root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": old}))
    assert [r["digest"] for r in store.lookup(name)] == [e["digest"] for e in old]
    assert sorted(r.platform for r in read_refs(store)) == ["linux/amd64", "linux/arm64/v8"]
    store.tag(name, {**manifest(store, 2), "platform": PLATFORMS[0]})
    check(store, {(name, 0): 2, (name, 1): 1})


def test_an_untag_of_before_renames_what_stays(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    name = NAMES[0]
    old = [{**manifest(store, p), "platform": PLATFORMS[p], "annotations": {REF_NAME: name}}
           for p in (0, 1, 2)]
    (store.root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": old}))
    ref = next(r for r in read_refs(store) if r.platform == "linux/ppc64le")
    store.untag(ref.same_entry)
    check(store, {(name, 0): 0, (name, 1): 1})
