"""Bundles at fsspec URLs: memory:// and file:// round trips of squashfs images and archives."""

from __future__ import annotations

import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from ocistage.cache.leases import Holder
from ocistage.errors import OcistageError
from ocistage.stagers.filemanifest import fill_hashes, scan
from ocistage.stagers.remote import (
    fetch_file,
    push_file,
    push_tree,
    stage_from_url,
)
from ocistage.stagers.unstage import unstage
from ocistage.stagers.urls import is_url
from pytest_ocistage.components import require_binary


def _view(root: Path) -> dict[str, tuple[object, ...]]:
    entries, _ = fill_hashes(root, scan(root), None, jobs=1)
    return {e.path: (e.type, e.mode, e.hash, e.target) for e in entries
            if e.path != "config.json"}


@pytest.fixture(params=["memory", "file"])
def base_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        url = f"memory://ocistage-test-{uuid.uuid4().hex[:8]}/bundles"
        yield url
        fs = fsspec.filesystem("memory")
        fs.rm(url.removeprefix("memory://").split("/")[0], recursive=True)
    else:
        yield f"file://{tmp_path / 'remote'}"


def test_file_round_trip_streams_and_publishes_whole(base_url: str, tmp_path: Path) -> None:
    local = tmp_path / "blob"
    local.write_bytes(b"x" * (9 << 20) + b"end")
    url = f"{base_url}/blob.bin"
    assert push_file(local, url) == (9 << 20) + 3
    fs, path = fsspec.core.url_to_fs(url)
    assert [p for p in fs.ls(path.rsplit("/", 1)[0], detail=False) if "partial" in p] == []
    back = tmp_path / "back"
    assert fetch_file(url, back) == (9 << 20) + 3
    assert back.read_bytes() == local.read_bytes()
    with pytest.raises(OcistageError, match="does not exist"):
        fetch_file(f"{base_url}/missing.sqfs", tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_squashfs_image_round_trip(base_url: str, tree: Path, tmp_path: Path) -> None:
    require_binary("mksquashfs")
    require_binary("unsquashfs")
    work = tmp_path / "work"
    work.mkdir()
    pushed = push_tree(tree, base_url, "img", format="squashfs", work=work, label="test")
    assert pushed.url == f"{base_url}/img.sqfs" and pushed.size > 0
    cache = tmp_path / "cache"
    staged = stage_from_url(pushed.url, tmp_path / "node", cache_root=cache,
                            holder=Holder.pin("r"), mount_image=False)
    assert staged.method == "squashfs-unpack"
    assert staged.path == tmp_path / "node" / "img"
    assert _view(staged.path) == _view(tree)
    assert unstage(staged.path, cache_root=cache)
    assert not staged.path.exists() and not (tmp_path / "node" / "img.sqfs").exists()


def test_tar_archive_round_trip(base_url: str, tree: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    pushed = push_tree(tree, base_url, "arch", format="dir", work=work, label="test")
    assert pushed.url == f"{base_url}/arch.tar"
    back = tmp_path / "arch.tar"
    fetch_file(pushed.url, back)
    with tarfile.open(back) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["rootfs/etc/escape"].issym()
    assert members["rootfs/etc/escape"].linkname == "/etc/shadow"
    assert members["rootfs/etc/hardlink"].islnk() or members["rootfs/bin/f1"].islnk()
    assert members["rootfs/ro"].mode & 0o777 == 0o555
    assert {e.path for e in scan(tree)} == set(members)


def test_only_squashfs_images_are_staged_from_urls(tmp_path: Path) -> None:
    with pytest.raises(OcistageError, match="not a squashfs image"):
        stage_from_url("memory://x/thing.tar", tmp_path, cache_root=tmp_path / "c",
                       holder=Holder.pin("r"))


@pytest.mark.parametrize(("text", "url"), [
    ("file:///tmp/x", True), ("memory://bundles", True), ("sftp://host/p", True),
    ("s3://bucket/key", True), ("docker://alpine", False), ("oci:/path:tag", False),
    ("/scratch/bundles", False), ("registry:5000/repo:tag", False),
])
def test_is_url_tells_urls_from_image_references(text: str, url: bool) -> None:
    assert is_url(text) is url
