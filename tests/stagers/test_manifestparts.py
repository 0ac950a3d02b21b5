"""The previous manifest read in parts (:mod:`ocistage.stagers.manifestparts`): the part of a
subtree or of a directory's listing is exactly the entries a full parse has there, in any
tree (symlink targets that start like a part, names that are not UTF-8), asked in walk order
or not, and what has no part gives none."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocistage.stagers.filemanifest import Manifest, entries_of_fields, scan
from ocistage.stagers.manifestparts import PreviousParts


def _tree(root: Path, seed: int, dirs: int) -> Path:
    rng = random.Random(seed)
    made = [root]
    root.mkdir()
    for n in range(dirs):
        parent = rng.choice(made)
        name = rng.choice(["a", "b", "ab", "a.b", "z", "\udcff-x", "é"]) + str(n % 4)
        path = parent / name
        if path.exists():
            continue
        path.mkdir()
        made.append(path)
    for n, directory in enumerate(made):
        for m in range(rng.randrange(4)):
            (directory / f"f{m}").write_bytes(b"%d" % n)
        # a target that starts like another part's path (a NUL-prefixed needle's trap)
        rel = os.path.relpath(rng.choice(made), root)
        os.symlink(f"{rel}/" if rel != "." else "x/", directory / f"l{n}")
    return root


def _prefixes(entries: list[tuple[str, str]]) -> list[str]:
    """The relative paths (ending in "/") of the directories, in walk order."""
    return [f"{path}/" for path, kind in entries if kind == "dir"]


def _parts(tmp_path: Path, seed: int, dirs: int) -> tuple[Manifest, PreviousParts]:
    tree = _tree(tmp_path / "t", seed, dirs)
    manifest = Manifest(tuple(scan(tree)), method="pool")
    return manifest, PreviousParts(b"".join(manifest.chunks(batch=7)))


def _expected(manifest: Manifest, prefix: str, subtree: bool) -> list[str]:
    return [e.path for e in manifest.entries if e.path.startswith(prefix)
            and (subtree or "/" not in e.path[len(prefix):])]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), dirs=st.integers(0, 40), shuffled=st.booleans())
def test_every_part_is_the_full_parse_s(tmp_path_factory: pytest.TempPathFactory, seed: int,
                                        dirs: int, shuffled: bool) -> None:
    manifest, parts = _parts(tmp_path_factory.mktemp("parts"), seed, dirs)
    asked = [(prefix, subtree) for prefix in ["", *_prefixes(
        [(e.path, e.type) for e in manifest.entries])] for subtree in (False, True)
        if prefix or not subtree]
    if shuffled:
        random.Random(seed).shuffle(asked)
    for prefix, subtree in asked:
        fields = parts.part(prefix, subtree, expected=1)
        entries = entries_of_fields(fields)
        assert [e.path for e in entries] == _expected(manifest, prefix, subtree), prefix
        assert list(entries) == [e for e in manifest.entries if e.path in
                                 set(_expected(manifest, prefix, subtree))]


def test_what_is_not_there_has_no_part(tmp_path: Path) -> None:
    manifest, parts = _parts(tmp_path, seed=3, dirs=10)
    assert parts.part("nowhere/", True, 10) == []
    assert parts.part("x/", True, 10) == []  # only symlink targets start so
    assert manifest.entries  # (the tree is not empty)


def test_a_manifest_in_json_or_cut_short_is_no_parts(tmp_path: Path) -> None:
    manifest, _ = _parts(tmp_path, seed=5, dirs=5)
    with pytest.raises(ValueError):
        PreviousParts(b"".join(manifest.json_chunks()))
    with pytest.raises(ValueError):
        PreviousParts(b"".join(manifest.chunks())[:22])


def test_the_head_says_the_method_and_what_read_will_find(tmp_path: Path) -> None:
    """:meth:`PreviousParts.head` reads the magic and the JSON line only: the method a
    re-stage checks before its workers start, and the identity they read the whole file by."""
    manifest, _ = _parts(tmp_path, seed=7, dirs=8)
    path = tmp_path / "manifest"
    path.write_bytes(b"".join(manifest.chunks(batch=7)))
    head = PreviousParts.head(path)
    assert head is not None and head[0] == "pool"
    found = PreviousParts.read(path, head[1])
    assert found is not None and found[1] == head[1] and found[0].method == "pool"
    path.write_bytes(b"".join(manifest.json_chunks()))
    assert PreviousParts.head(path) is None
    path.write_bytes(b"".join(manifest.chunks())[:22])  # cut short in its JSON line
    assert PreviousParts.head(path) is None
    assert PreviousParts.head(tmp_path / "missing") is None
    assert PreviousParts.read(path, head[1]) is None  # no longer that file
