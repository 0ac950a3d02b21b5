from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ocistage.stagers.filemanifest import (
    MANIFEST_MAGIC,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    MARKER_NAME,
    Entry,
    Manifest,
    fill_hashes,
    hash_file,
    load_manifest,
    scan,
    unchanged,
)
from tests.stagers.conftest import SECRET_MODE


def test_scan_lists_every_entry_without_following_links(tree: Path) -> None:
    entries = {e.path: e for e in scan(tree)}
    assert entries["rootfs/etc/escape"].type == "symlink"
    assert entries["rootfs/etc/escape"].target == "/etc/shadow"
    assert entries["rootfs/etc/fifo"].type == "fifo"
    assert entries["rootfs/ro"].type == "dir" and entries["rootfs/ro"].mode == 0o555
    assert entries["rootfs/secret"].mode == SECRET_MODE
    assert entries["rootfs/bin/f1"].ino == entries["rootfs/etc/hardlink"].ino
    # parents come before children
    order = [e.path for e in scan(tree)]
    assert order.index("rootfs") < order.index("rootfs/bin") < order.index("rootfs/bin/f0")


def test_scan_skips_ocistage_files_at_the_top_only(tree: Path) -> None:
    (tree / MANIFEST_NAME).write_text("{}")
    (tree / MARKER_NAME).write_text("{}")
    (tree / "rootfs" / MARKER_NAME).write_text("image data\n")
    paths = {e.path for e in scan(tree)}
    assert MANIFEST_NAME not in paths and MARKER_NAME not in paths
    assert f"rootfs/{MARKER_NAME}" in paths


def test_hashes_are_reused_when_the_stat_matches(tree: Path) -> None:
    entries, hashed = fill_hashes(tree, scan(tree), None, jobs=4)
    files = [e for e in entries if e.type == "file"]
    assert hashed == len(files)
    previous = Manifest(tuple(entries))
    again, hashed_again = fill_hashes(tree, scan(tree), previous, jobs=4)
    assert hashed_again == 0
    assert again == entries
    target = tree / "rootfs" / "bin" / "f3"
    target.write_bytes(b"changed\n")
    changed, hashed_changed = fill_hashes(tree, scan(tree), previous, jobs=4)
    assert hashed_changed == 1
    new = {e.path: e for e in changed}["rootfs/bin/f3"]
    assert new.hash == hash_file(target) != {e.path: e for e in entries}["rootfs/bin/f3"].hash


def test_unchanged_detects_stat_changes_additions_and_removals(tree: Path) -> None:
    previous = Manifest(tuple(fill_hashes(tree, scan(tree), None)[0]))
    assert unchanged(scan(tree), previous)
    f = tree / "rootfs" / "bin" / "f2"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert not unchanged(scan(tree), previous)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert unchanged(scan(tree), previous)
    (tree / "rootfs" / "new").write_text("n")
    assert not unchanged(scan(tree), previous)
    (tree / "rootfs" / "new").unlink()
    (tree / "rootfs" / "etc" / "rel").unlink()
    os.symlink("../bin/f1", tree / "rootfs" / "etc" / "rel")
    assert not unchanged(scan(tree), previous)


def test_manifest_round_trip(tree: Path, tmp_path: Path) -> None:
    manifest = Manifest(tuple(fill_hashes(tree, scan(tree), None)[0]), source="s",
                        method="pool", readonly_root=True)
    path = tmp_path / "m.json"
    path.write_bytes(b"".join(manifest.json_chunks()))
    assert load_manifest(path) == manifest
    path.write_text('{"version": 99}')
    assert load_manifest(path) is None
    assert load_manifest(tmp_path / "missing") is None



@pytest.mark.parametrize("count", [0, 1, 2, 4096, 4097, 9000])
def test_manifest_pieces_make_the_document_one_dumps_makes(count: int) -> None:
    """The manifest is written in pieces (never held whole); the bytes are exactly those of
    one ``json.dumps`` of the whole document, the format every ocistage version reads."""
    import json

    names = ["plain", "dïr/ünï", "new\nline", "surrogate-\udcff", 'quo"te']
    entries = tuple(Entry(f"d/{n}-{names[n % 5]}", "file" if n % 3 else "symlink", 0o644,
                          n, 10**18 + n, 2049, n, f"{n:032x}" if n % 3 else None,
                          None if n % 3 else "../t") for n in range(count))
    manifest = Manifest(entries, source="/src/ü", method="pool", readonly_root=True)
    whole = json.dumps({"version": MANIFEST_VERSION, "source": "/src/ü", "method": "pool",
                        "readonlyRoot": True, "entries": entries},
                       separators=(",", ":")).encode()
    assert b"".join(manifest.json_chunks()) == whole
    assert all(len(piece) < 4096 * 200 for piece in manifest.json_chunks())
    assert Manifest.from_json(whole) == manifest

def test_hash_file_streams_and_refuses_symlinks(tmp_path: Path) -> None:
    big = tmp_path / "big"
    with big.open("wb") as out:
        for _ in range(5):
            out.write(os.urandom(1 << 20))
    import xxhash

    assert hash_file(big) == xxhash.xxh3_128(big.read_bytes()).hexdigest()
    os.symlink(big, tmp_path / "link")
    with pytest.raises(OSError):
        hash_file(tmp_path / "link")


def test_stat_digest_is_the_digest_of_the_scan(tree: Path) -> None:
    from ocistage.stagers.filemanifest import entries_digest, stat_digest

    (tree / "rootfs" / "bin" / "sub" / "deeper").mkdir(parents=True)
    (tree / "rootfs" / "bin" / "sub" / "deeper" / "x").write_text("x")
    before = stat_digest(tree)
    assert before == entries_digest(scan(tree))
    (tree / "rootfs" / "bin" / "sub" / "deeper" / "x").write_text("y")
    assert stat_digest(tree) != before


def test_one_walk_gives_the_digest_and_the_entries(tree: Path) -> None:
    from ocistage.stagers.filemanifest import Record, entries_of, stat_digest, walk_digest

    records: list[Record] = []
    assert walk_digest(tree, records) == stat_digest(tree)
    assert entries_of(records) == scan(tree)
    assert walk_digest(tree, None) == stat_digest(tree)


def test_entries_of_keeps_hashes_of_files_whose_stat_is_unchanged(tree: Path) -> None:
    from ocistage.stagers.filemanifest import Record, entries_of, fill_missing_hashes, walk_digest

    hashed, _ = fill_hashes(tree, scan(tree), None, jobs=1)
    # a hash that is not the content's: kept as long as the stat matches (never read again)
    before = {e.path: e.with_hash("0" * 32) if e.type == "file" else e for e in hashed}
    (tree / "rootfs" / "bin" / "f2").write_bytes(b"new content\n")
    records: list[Record] = []
    walk_digest(tree, records)
    entries = entries_of(records, before)
    by_path = {e.path: e for e in entries}
    assert by_path["rootfs/bin/f2"].hash is None
    assert by_path["rootfs/bin/f5"].hash == "0" * 32
    assert all(e.hash is None for e in entries if e.type != "file")
    filled, read = fill_missing_hashes(tree, entries, jobs=2)
    assert read == 1
    assert {e.path: e.hash for e in filled}["rootfs/bin/f2"] == hash_file(
        tree / "rootfs" / "bin" / "f2")


_TEXT = st.text(st.characters(blacklist_characters="\0"), max_size=20)
_INTS = st.integers(min_value=0, max_value=2**64)
_HEX = st.none() | st.text("0123456789abcdef", min_size=1, max_size=32)
_ENTRIES = st.builds(
    Entry, path=_TEXT.filter(bool), type=st.sampled_from(["dir", "file", "symlink", "fifo",
                                                           "other"]),
    mode=st.integers(0, 0o7777), size=_INTS, mtime_ns=st.integers(-2**63, 2**63),
    dev=_INTS, ino=_INTS, hash=_HEX, target=st.none() | _TEXT.filter(bool),
    ctime_ns=st.integers(-2**63, 2**63), xattrs=st.none() | st.just("") | _HEX)


@given(entries=st.lists(_ENTRIES, max_size=30), batch=st.integers(1, 8), source=_TEXT,
       method=_TEXT, readonly_root=st.booleans())
def test_the_compact_manifest_reads_back_what_was_written(
        entries: list[Entry], batch: int, source: str, method: str,
        readonly_root: bool) -> None:
    """Any entries (names with newlines, lone surrogates, any text but NUL; no hash, no link
    target, xattrs unknown or none) read back equal, whatever the pieces it was written in;
    the JSON manifest of the same entries reads back the same."""
    manifest = Manifest(tuple(entries), source=source, method=method,
                        readonly_root=readonly_root)
    data = b"".join(manifest.chunks(batch))
    assert data.startswith(MANIFEST_MAGIC)
    assert Manifest.from_bytes(data) == manifest
    assert Manifest.from_bytes(b"".join(manifest.json_chunks(batch))) == manifest


def test_a_json_manifest_is_still_read_and_a_damaged_compact_one_is_none(
        tree: Path, tmp_path: Path) -> None:
    manifest = Manifest(tuple(fill_hashes(tree, scan(tree), None)[0]), source="s",
                        method="pool", readonly_root=True)
    path = tmp_path / "m"
    path.write_bytes(b"".join(manifest.json_chunks()))  # as versions before 2 wrote it
    assert load_manifest(path) == manifest
    data = b"".join(manifest.chunks())
    path.write_bytes(data)
    assert load_manifest(path) == manifest
    for damaged in (data[:-1], data[:-40], data + b"x\0", data.replace(b"\0file\0", b"\0f\0")):
        path.write_bytes(damaged)
        assert load_manifest(path) is None, damaged[-60:]
