"""stage_directory: methods, incremental re-staging, atomic publish, concurrency, kill -9."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ocistage.cache import leases
from ocistage.cache.leases import Holder
from ocistage.cache.targetlayout import TMP_DIR
from ocistage.errors import OcistageError
from ocistage.stagers.directory import StageResult, stage_directory
from ocistage.stagers.filemanifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    fill_hashes,
    hash_file,
    load_manifest,
    scan,
)
from ocistage.stagers.markers import Marker
from tests.removers import settle
from tests.stagers.conftest import make_tree

REPO = Path(__file__).resolve().parents[2]


def _tree_view(root: Path) -> dict[str, tuple[object, ...]]:
    """What a staged tree must reproduce: type, mode, content hash, link target per path."""
    entries, _ = fill_hashes(root, scan(root), None, jobs=1)
    return {e.path: (e.type, e.mode, e.hash, e.target) for e in entries
            if e.path != "config.json"}


def _stage(source: Path, to: Path, cache: Path, **kwargs: object) -> StageResult:
    return stage_directory(source, to, cache_root=cache, holder=Holder.pin("test"),
                           **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["same-fs", "other-fs"])
@pytest.mark.parametrize("link", [None, False])
def test_staged_tree_equals_the_source(tree: Path, tmp_path: Path, other_fs: Path,
                                       where: str, link: bool | None) -> None:
    to = tmp_path / "target" if where == "same-fs" else other_fs
    result = _stage(tree, to, tmp_path / "cache", link=link)
    # a tree of the user's can be written: never hard-linked (issue 27.7), even on one fs
    expected = {None: {"same-fs": "pool", "other-fs": "pool"}, False: {
        "same-fs": "copy", "other-fs": "copy"}}[link][where]
    assert result.method == expected and type(result.method) is str  # the name, no enum
    assert result.path == to / "bundle"
    assert _tree_view(result.path) == _tree_view(tree)
    files = sum(1 for e in scan(tree) if e.type == "file")
    assert result.files == files
    assert result.copied + result.linked + result.unchanged == files
    source_ino = (tree / "rootfs" / "bin" / "f5").stat().st_ino
    staged_ino = (result.path / "rootfs" / "bin" / "f5").stat().st_ino
    assert (source_ino == staged_ino) == (expected == "hardlink")
    # a hardlink group of the source stays one
    assert (result.path / "rootfs" / "bin" / "f1").stat().st_ino == \
        (result.path / "rootfs" / "etc" / "hardlink").stat().st_ino
    config = json.loads((result.path / "config.json").read_text())
    assert config["root"]["readonly"] is (expected != "copy")
    assert json.loads((tree / "config.json").read_text())["root"]["readonly"] is False
    marker = Marker.from_json((result.path / MARKER_NAME).read_bytes())
    assert marker.id == result.lease_id and marker.source == str(tree)
    lease_list = leases.leases_on(tmp_path / "cache", f"staged:{result.path}")
    assert [lease.id for lease in lease_list] == [result.lease_id]
    assert not os.path.lexists(to / TMP_DIR)  # the scratch dir goes once it is empty


@pytest.mark.parametrize("link", [None, False])
def test_restaging_is_incremental(tree: Path, tmp_path: Path, other_fs: Path,
                                  link: bool | None) -> None:
    cache = tmp_path / "cache"
    first = _stage(tree, other_fs, cache, link=link)
    assert first.copied == first.files - 1  # one is a hardlink of another source file
    manifest = load_manifest(first.path / MANIFEST_NAME)
    assert manifest is not None
    hashes = {e.path: e.hash for e in manifest.entries if e.type == "file"}
    assert hashes == {e.path: hash_file(tree / e.path) for e in scan(tree) if e.type == "file"}
    again = _stage(tree, other_fs, cache, link=link)
    assert (again.unchanged, again.copied, again.linked) == (first.files, 0, 0)
    assert again.lease_id == first.lease_id  # the same holder keeps one lease
    manifest_before = (first.path / MANIFEST_NAME).stat().st_ino
    assert (again.path / MANIFEST_NAME).stat().st_ino == manifest_before  # nothing rewritten
    (tree / "rootfs" / "bin" / "f7").write_bytes(b"a new version of f7\n")
    (tree / "rootfs" / "added").write_bytes(b"new file\n")
    (tree / "rootfs" / "bin" / "f9").unlink()
    changed = _stage(tree, other_fs, cache, link=link)
    assert changed.files == first.files
    assert changed.copied == 2
    assert changed.unchanged + changed.linked == first.files - 2
    assert (changed.path / "rootfs" / "bin" / "f7").read_bytes() == b"a new version of f7\n"
    assert not (changed.path / "rootfs" / "bin" / "f9").exists()
    assert _tree_view(changed.path) == _tree_view(tree)
    # the old version is gone (its remover done), and with it the pool entries only it used
    settle(cache)
    if changed.method == "pool":
        pooled = {p.name for p in (other_fs / ".ocistage-pool").rglob("*") if p.is_file()}
        assert len(pooled) == len({(v[1], v[2]) for v in _tree_view(tree).values()
                                   if v[0] == "file"})


def test_a_second_image_copies_only_what_differs(tmp_path: Path, other_fs: Path) -> None:
    cache = tmp_path / "cache"
    one = make_tree(tmp_path / "one", files=30, seed=0)
    two = make_tree(tmp_path / "two", files=30, seed=0)
    for n in range(3):
        (two / "rootfs" / "bin" / f"f{n + 10}").write_bytes(f"different {n}\n".encode())
    first = _stage(one, other_fs, cache)
    second = _stage(two, other_fs, cache)
    assert first.path != second.path
    assert second.copied == 3 + 1  # three changed files and its own config.json
    assert second.linked == second.files - 4
    assert (first.path / "rootfs" / "bin" / "f0").stat().st_ino == \
        (second.path / "rootfs" / "bin" / "f0").stat().st_ino


def test_a_changed_mode_is_a_change(tree: Path, tmp_path: Path, other_fs: Path) -> None:
    cache = tmp_path / "cache"
    _stage(tree, other_fs, cache)
    (tree / "rootfs" / "bin" / "f2").chmod(0o700)
    result = _stage(tree, other_fs, cache)
    assert result.copied == 1
    assert (result.path / "rootfs" / "bin" / "f2").stat().st_mode & 0o777 == 0o700
    assert (result.path / "rootfs" / "bin" / "f3").stat().st_mode & 0o777 == 0o644


def test_sealed_cache_bundles_are_not_walked_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    bundle = make_tree(cache / "bundles" / ("ab" * 32))
    first = _stage(bundle, tmp_path / "t", cache)
    assert first.method == "hardlink"
    manifest = load_manifest(first.path / MANIFEST_NAME)
    assert manifest is not None and manifest.source.startswith(str(bundle))
    again = _stage(bundle, tmp_path / "t", cache)
    assert again.unchanged == first.files and again.copied == again.linked == 0


def test_a_writable_tree_is_never_hardlinked(tree: Path, tmp_path: Path) -> None:
    """Only sealed cache content may share inodes with a staged tree: a write into the
    source (a container running on a ``bundle REF DEST``) must not reach the staged copy."""
    cache = tmp_path / "cache"
    result = _stage(tree, tmp_path / "t", cache)
    assert result.method == "pool"
    source_file = tree / "rootfs" / "bin" / "f3"
    before = source_file.read_bytes()
    with open(source_file, "r+b") as file:  # in place: the same inode
        file.write(b"rewritten by a container")
    assert (result.path / "rootfs" / "bin" / "f3").read_bytes() == before
    for path in (tree / "rootfs").rglob("*"):
        if path.is_file() and not path.is_symlink():
            staged = result.path / path.relative_to(tree)
            assert staged.stat().st_ino != path.stat().st_ino
    with pytest.raises(OcistageError, match="only a bundle in the cache"):
        _stage(tree, tmp_path / "t", cache, link=True, name="forced")


@pytest.mark.parametrize("how", ["missing", "replaced"])
@pytest.mark.parametrize("where", ["hardlink", "pool"])
def test_a_restage_writes_a_private_config_when_the_staged_one_is_not(
        tree: Path, tmp_path: Path, other_fs: Path, how: str, where: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-stage with config.json unchanged in the source, whose previous private copy is
    gone or replaced (by the source's own file, as an older version linked it; by a copy of
    it): the new version gets a private, read-only-root copy again, never a link of the
    source's or the pool's file."""
    from ocistage.stagers import directory as stage_module

    cache = tmp_path / "cache"
    to = tmp_path / "t" if where == "hardlink" else other_fs
    if where == "hardlink":  # as a cache bundle, staged by hardlink; walked on each stage
        monkeypatch.setattr(stage_module, "source_identity",
                            lambda source, cache_root: f"sealed:{time.monotonic_ns()}")
    first = _stage(tree, to, cache)
    assert first.method == where
    staged_config = first.path / "config.json"
    staged_config.unlink()
    if how == "replaced" and where == "hardlink":
        os.link(tree / "config.json", staged_config)
    elif how == "replaced":
        staged_config.write_bytes((tree / "config.json").read_bytes())
    (tree / "rootfs" / "bin" / "f2").write_bytes(b"changed, so a new version is built\n")
    again = _stage(tree, to, cache)
    config = again.path / "config.json"
    assert config.stat().st_ino != (tree / "config.json").stat().st_ino
    assert config.stat().st_nlink == 1
    assert json.loads(config.read_text())["root"]["readonly"] is True
    assert json.loads((tree / "config.json").read_text())["root"]["readonly"] is False


def test_names_and_foreign_paths_are_refused(tree: Path, tmp_path: Path) -> None:
    for bad in ("..", "a/b", ".ocistage-pool", ".ocistage-tmp"):
        with pytest.raises(OcistageError, match="invalid staged name"):
            _stage(tree, tmp_path / "t", tmp_path / "cache", name=bad)
    (tmp_path / "t" / "mine").mkdir(parents=True)
    (tmp_path / "t" / "mine" / "data").write_text("user data")
    with pytest.raises(OcistageError, match="not staged by ocistage"):
        _stage(tree, tmp_path / "t", tmp_path / "cache", name="mine")
    assert (tmp_path / "t" / "mine" / "data").read_text() == "user data"
    with pytest.raises(OcistageError, match="inside the source"):
        _stage(tree, tree / "rootfs" / "staged-here", tmp_path / "cache")
    assert not (tree / "rootfs" / "staged-here").exists()
    shm = Path(tempfile.mkdtemp(prefix="ocistage-otherfs-", dir="/dev/shm"))
    try:  # a target of its own there: the stager makes its tmp/ in the target
        with pytest.raises(OcistageError, match="different filesystems"):
            _stage(tree, shm, tmp_path / "cache", link=True, name="never")
    finally:
        shutil.rmtree(shm)


_CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from ocistage.cache.leases import Holder
from ocistage.stagers.directory import stage_directory
r = stage_directory(Path(sys.argv[1]), Path(sys.argv[2]), cache_root=Path(sys.argv[3]),
                    holder=Holder.pin(sys.argv[4]), link=sys.argv[5] == "link" or None,
                    jobs=1)
print(json.dumps({{"path": str(r.path), "copied": r.copied, "unchanged": r.unchanged,
                   "files": r.files}}))
"""


def _child(source: Path, to: Path, cache: Path, pin: str, link: str = "auto"
           ) -> subprocess.Popen[str]:
    if link == "copy":
        code = _CHILD.replace('link=sys.argv[5] == "link" or None', "link=False")
    else:
        code = _CHILD
    return subprocess.Popen([sys.executable, "-c", code.format(repo=str(REPO)), str(source),
                             str(to), str(cache), pin, link], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_eight_concurrent_stagers_make_one_copy(tree: Path, tmp_path: Path,
                                                other_fs: Path) -> None:
    cache = tmp_path / "cache"
    children = [_child(tree, other_fs, cache, f"p{n}") for n in range(8)]
    results = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        results.append(json.loads(out))
    assert len({r["path"] for r in results}) == 1
    files = results[0]["files"]
    builders = [r for r in results if r["copied"]]
    assert len(builders) == 1  # one built it; the other seven found it staged
    assert all(r["unchanged"] == files for r in results if r not in builders)
    assert sorted(os.listdir(other_fs)) == [".ocistage-pool", "bundle"]
    assert len(leases.leases_on(cache, f"staged:{other_fs / 'bundle'}")) == 8
    assert _tree_view(other_fs / "bundle") == _tree_view(tree)


def test_a_killed_stager_leaves_nothing_visible_and_the_next_run_completes(
        tmp_path: Path, other_fs: Path) -> None:
    source = other_fs / "big"
    (source / "rootfs").mkdir(parents=True)
    blob = os.urandom(16 << 10)
    for n in range(3000):
        (source / "rootfs" / f"f{n:05d}").write_bytes(blob[n % 1024:] + n.to_bytes(4, "big"))
    to, cache = other_fs / "t", tmp_path / "cache"
    child = _child(source, to, cache, "killed", link="copy")
    scratch_files = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.poll() is None:
        scratches = [p for p in (to / TMP_DIR).glob("big.*") if p.is_dir()] \
            if (to / TMP_DIR).is_dir() else []
        if scratches and (scratches[0] / "rootfs").is_dir():
            scratch_files = len(os.listdir(scratches[0] / "rootfs"))
            if scratch_files > 200:
                break
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert scratch_files > 200, "the stager finished before it could be killed mid-copy"
    assert not os.path.lexists(to / "big")  # nothing half-visible at the final path
    result = _stage(source, to, cache, link=False)
    assert result.files == 3000 and result.copied == 3000
    assert _tree_view(result.path) == _tree_view(source)
    assert not os.path.lexists(to / TMP_DIR)  # the killed one's scratch and lock went too


def test_a_symlink_planted_in_a_writable_copy_is_not_followed_on_restage(
        tree: Path, tmp_path: Path) -> None:
    """A container may rewrite its (writable, --copy) rootfs: the next re-stage must not
    hardlink host files in through a symlink it planted."""
    cache = tmp_path / "cache"
    host = tmp_path / "host-secrets"
    (host / "bin").mkdir(parents=True)
    for n in range(40):
        (host / "bin" / f"f{n}").write_text("host secret\n")
    first = _stage(tree, tmp_path / "t", cache, link=False)
    staged_rootfs = first.path / "rootfs"
    os.rename(staged_rootfs / "bin", tmp_path / "moved-bin")
    os.symlink(host, staged_rootfs / "bin-link")
    os.symlink(host / "bin", staged_rootfs / "bin")
    (tree / "rootfs" / "etc" / "passwd").write_text("changed\n")  # force a rebuild
    again = _stage(tree, tmp_path / "t", cache, link=False)
    assert _tree_view(again.path) == _tree_view(tree)
    for n in range(40):
        staged = again.path / "rootfs" / "bin" / f"f{n}"
        assert staged.stat().st_ino != (host / "bin" / f"f{n}").stat().st_ino
    assert all((host / "bin" / f"f{n}").stat().st_nlink == 1 for n in range(40))


@pytest.mark.parametrize("where", ["same-fs", "other-fs"])
def test_an_unchanged_restage_does_not_read_the_previous_manifest(
        tree: Path, tmp_path: Path, other_fs: Path, where: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stat digest is compared with the marker first: the manifest (11 MB of JSON for
    100k files) is read only when the tree changed, and then its hashes are taken over."""
    from ocistage.stagers.transaction import Staging

    to = tmp_path / "target" if where == "same-fs" else other_fs
    first = _stage(tree, to, tmp_path / "cache")
    reads: list[Path] = []
    original = Staging.previous

    def counted(self: Staging) -> object:
        reads.append(self.final)
        return original(self)

    monkeypatch.setattr(Staging, "previous", counted)
    again = _stage(tree, to, tmp_path / "cache")
    assert (again.unchanged, again.copied, again.linked) == (first.files, 0, 0)
    assert reads == []
    (tree / "rootfs" / "bin" / "f3").write_bytes(b"changed\n")
    changed = _stage(tree, to, tmp_path / "cache")
    assert reads == [first.path]
    assert changed.unchanged == first.files - 1
    assert _tree_view(changed.path) == _tree_view(tree)
