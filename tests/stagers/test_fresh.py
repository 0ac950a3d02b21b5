"""The first stage of a tree (ocistage.stagers.fresh): walking and placing at once in forked workers
gives the entries, order and tree digest of a plain walk, and the tree a walk-then-build
stage gives; modes survive any umask."""

from __future__ import annotations

import os
import stat
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ocistage.cache.leases import Holder
from ocistage.cache.treeremoval import remove_tree
from ocistage.stagers import builder as builder_module
from ocistage.stagers import fresh
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.filemanifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    StageError,
    entries_of,
    load_manifest,
    walk,
    walk_digest,
)
from ocistage.stagers.markers import Marker
from tests.stagers.conftest import SECRET_MODE, make_tree

NAMES = st.sampled_from(["a", "b", "B", "a.b", "a-b", "_", "z", "10", "9", ".hidden",
                         ".ocistage-manifest.json", "config.json"])
CONTENTS = st.sampled_from([b"", b"x", b"same\n", b"same\n" * 300, b"\0" * 5000])
MODES = st.sampled_from([0o644, 0o755, 0o600, 0o444])


def _nodes(depth: int) -> st.SearchStrategy[dict[str, object]]:
    leaf = st.one_of(st.tuples(st.just("file"), CONTENTS, MODES),
                     st.tuples(st.just("symlink"), st.sampled_from(["a", "../b", "/etc"])),
                     st.just(("fifo",)))
    if depth == 0:
        return st.dictionaries(NAMES, leaf, max_size=5)
    return st.dictionaries(NAMES, st.one_of(leaf, _nodes(depth - 1)), max_size=5)


def _build(root: Path, nodes: dict[str, object]) -> None:
    root.mkdir()
    for name, node in nodes.items():
        path = root / name
        if isinstance(node, dict):
            _build(path, node)
            continue
        assert isinstance(node, tuple)
        if node[0] == "file":
            path.write_bytes(node[1])
            path.chmod(node[2])
        elif node[0] == "symlink":
            os.symlink(node[1], path)
        else:
            os.mkfifo(path)


@pytest.fixture
def forked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Take the parallel path (forked workers, a queue of runs) even for a small tree."""
    monkeypatch.setattr(fresh, "FORK_MIN_FILES", 1)
    monkeypatch.setattr(fresh, "MIN_RUN", 2)
    monkeypatch.setattr(builder_module, "usable_cpus", lambda: 2)
    monkeypatch.setattr("ocistage.stagers.directory.usable_cpus", lambda: 2)


@pytest.fixture
def scratch_dirs() -> Iterator[tuple[Path, Path]]:
    """(a directory on tmp's filesystem, one on /dev/shm) for hypothesis examples."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as here:
        shm = Path("/dev/shm") / f"ocistage-fresh-{uuid.uuid4().hex[:10]}"
        shm.mkdir()
        try:
            yield Path(here), shm
        finally:
            remove_tree(shm)


@pytest.mark.usefixtures("forked", "sealed")
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=_nodes(3), where=st.sampled_from(["same-fs", "other-fs"]))
def test_a_first_stage_records_what_a_walk_sees(
        scratch_dirs: tuple[Path, Path], nodes: dict[str, object], where: str) -> None:
    here, shm = scratch_dirs
    run = uuid.uuid4().hex[:8]
    source = here / f"src-{run}"
    _build(source, nodes)
    to = (shm if where == "other-fs" else here) / f"to-{run}"
    result = stage_directory(source, to, cache_root=here / "cache", holder=Holder.pin("t"),
                             jobs=2)
    assert result.method == ("pool" if where == "other-fs" else "hardlink")
    manifest = load_manifest(result.path / MANIFEST_NAME)
    assert manifest is not None
    # hardlink staging records no ctimes (its links move them) and no xattr digests
    ctime = result.method != "hardlink"
    expected = entries_of(walk(source, ctime=ctime))
    assert [e._replace(hash=None, xattrs=None) for e in manifest.entries] == expected
    assert all((e.xattrs == "") == ctime for e in manifest.entries if e.type == "file")
    marker = Marker.from_json((result.path / MARKER_NAME).read_bytes())
    assert marker.tree == walk_digest(source, None, ctime)
    for entry in manifest.entries:
        staged = result.path / entry.path
        st_ = staged.lstat()
        if entry.path in (".ocistage-manifest.json", "config.json"):
            continue  # a reserved name at the top; config.json may be rewritten
        assert stat.S_IMODE(st_.st_mode) == entry.mode or entry.type == "symlink"
        if entry.type == "file":
            data = staged.read_bytes()
            assert data == (source / entry.path).read_bytes()
            assert entry.hash == (xxhash.xxh3_128(data).hexdigest() if where == "other-fs"
                                  else None)
        elif entry.type == "symlink":
            assert os.readlink(staged) == entry.target
        elif entry.type == "dir":
            assert st_.st_mtime_ns == entry.mtime_ns
    again = stage_directory(source, to, cache_root=here / "cache", holder=Holder.pin("t"),
                            jobs=2)
    assert (again.unchanged, again.copied, again.linked) == (result.files, 0, 0)


@pytest.mark.usefixtures("forked")
def test_forked_and_plain_first_stages_build_the_same_tree(
        tmp_path: Path, other_fs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_tree(tmp_path / "src", files=200)
    forked_stage = stage_directory(source, other_fs, cache_root=tmp_path / "cache",
                                   name="forked", holder=Holder.pin("t"), jobs=2)
    monkeypatch.setattr(fresh, "FORK_MIN_FILES", 10**9)
    plain = stage_directory(source, other_fs / "plain", cache_root=tmp_path / "cache",
                            holder=Holder.pin("t"), jobs=2)
    one, two = (load_manifest(r.path / MANIFEST_NAME) for r in (forked_stage, plain))
    assert one is not None and two is not None
    assert one.entries == two.entries
    assert forked_stage.copied == forked_stage.files - 1  # a source hardlink pair: one copy
    assert plain.copied == plain.files - 1


@pytest.mark.usefixtures("forked")
def test_a_first_stage_into_a_used_pool_copies_only_new_contents(
        tmp_path: Path, other_fs: Path) -> None:
    one = make_tree(tmp_path / "one", files=60, seed=0)
    two = make_tree(tmp_path / "two", files=60, seed=0)
    for n in range(3):
        (two / "rootfs" / "bin" / f"f{n + 10}").write_bytes(f"different {n}\n".encode())
    first = stage_directory(one, other_fs, cache_root=tmp_path / "cache",
                            holder=Holder.pin("t"), jobs=2)
    second = stage_directory(two, other_fs, cache_root=tmp_path / "cache",
                             holder=Holder.pin("t"), jobs=2)
    assert second.copied == 3 + 1  # three changed files and its own config.json
    assert second.linked == second.files - 4
    assert (first.path / "rootfs" / "bin" / "f0").stat().st_ino == \
        (second.path / "rootfs" / "bin" / "f0").stat().st_ino


@pytest.mark.usefixtures("forked")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o027])
def test_modes_survive_any_umask(tmp_path: Path, other_fs: Path, umask: int) -> None:
    source = tmp_path / "src"
    source.mkdir()
    modes = [0o644, 0o755, 0o600, 0o444, 0o4755, 0o2755, 0o1777, SECRET_MODE]  # 000 for root
    for n, mode in enumerate(modes):
        path = source / f"f{n}"
        path.write_bytes(f"content {n}\n".encode())
        path.chmod(mode)
    old = os.umask(umask)
    try:
        result = stage_directory(source, other_fs, cache_root=tmp_path / "cache",
                                 holder=Holder.pin("t"), jobs=2)
    finally:
        os.umask(old)
    for n, mode in enumerate(modes):
        assert stat.S_IMODE((result.path / f"f{n}").stat().st_mode) == mode
    pooled = sorted(p for p in (other_fs / ".ocistage-pool").rglob("*") if p.is_file())
    assert sorted(stat.S_IMODE(p.stat().st_mode) for p in pooled) == sorted(modes)
    assert all(p.name.endswith(f"-{stat.S_IMODE(p.stat().st_mode):04o}") for p in pooled)


def test_an_entry_that_became_a_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(StageError, match="became a directory"):
        fresh._stat_run(os.fspath(tmp_path), [(0, "d")], True)
