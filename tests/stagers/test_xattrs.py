"""Extended attributes (issue 27.8): pool and copy staging keep them (hardlink and squashfs
keep the inode's), an xattr-only change is a change, what the target refuses is counted in one
warning, and a manifest written before xattrs were recorded still reads."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest

from ocistage.cache.leases import Holder
from ocistage.stagers import xattrs
from ocistage.stagers.directory import StageResult, stage_directory
from ocistage.stagers.filemanifest import MANIFEST_NAME, MARKER_NAME, load_manifest
from pytest_ocistage.components import require_root

CAP_NET_RAW = bytes.fromhex("0100000200200000000000000000000000000000")  # VFS_CAP v2, +ep


def _stage(source: Path, to: Path, cache: Path, **kwargs: object) -> StageResult:
    return stage_directory(source, to, cache_root=cache, holder=Holder.pin("test"),
                           **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def xtree(tree: Path) -> Path:
    """The stagers tree with xattrs on two files (one shares its content with a file
    without: they must not share a pool entry)."""
    try:
        os.setxattr(tree / "rootfs" / "bin" / "f4", "user.origin", b"image layer 3")
    except OSError as exc:
        pytest.skip(f"no user xattrs here: {exc}")
    (tree / "rootfs" / "bin" / "twin").write_bytes((tree / "rootfs" / "bin" / "f5").read_bytes())
    os.setxattr(tree / "rootfs" / "bin" / "twin", "user.a", b"1")
    os.setxattr(tree / "rootfs" / "bin" / "twin", "user.b", b"")
    return tree


def _where(where: str, tmp_path: Path, other_fs: Path) -> tuple[Path, bool | None]:
    return {"pool-other-fs": (other_fs, None), "pool-same-fs": (tmp_path / "t", None),
            "copy": (tmp_path / "t", False)}[where]


WHERES = ["pool-other-fs", "pool-same-fs", "copy"]


@pytest.mark.parametrize("where", WHERES)
def test_pool_and_copy_staging_keep_xattrs(xtree: Path, tmp_path: Path, other_fs: Path,
                                           where: str) -> None:
    to, link = _where(where, tmp_path, other_fs)
    result = _stage(xtree, to, tmp_path / "cache", link=link)
    assert result.method == ("copy" if link is False else "pool")
    staged = result.path / "rootfs" / "bin"
    assert os.getxattr(staged / "f4", "user.origin") == b"image layer 3"
    assert sorted(os.listxattr(staged / "twin")) == ["user.a", "user.b"]
    assert os.listxattr(staged / "f5") == []
    assert (staged / "twin").stat().st_ino != (staged / "f5").stat().st_ino
    manifest = load_manifest(result.path / MANIFEST_NAME)
    assert manifest is not None
    by_path = manifest.by_path()
    assert by_path["rootfs/bin/f4"].xattrs == xattrs.digest(os.fspath(xtree / "rootfs/bin/f4"))
    assert by_path["rootfs/bin/f5"].xattrs == ""


@pytest.mark.parametrize("where", WHERES)
def test_an_xattr_only_change_is_a_change(xtree: Path, tmp_path: Path, other_fs: Path,
                                          where: str) -> None:
    to, link = _where(where, tmp_path, other_fs)
    cache = tmp_path / "cache"
    first = _stage(xtree, to, cache, link=link)
    again = _stage(xtree, to, cache, link=link)
    assert again.unchanged == first.files  # nothing changed: nothing done
    source = xtree / "rootfs" / "bin" / "f6"
    os.setxattr(source, "user.new", b"added later")          # a new xattr
    os.setxattr(xtree / "rootfs" / "bin" / "f4", "user.origin", b"changed")  # a new value
    changed = _stage(xtree, to, cache, link=link)
    assert changed.copied == 2 and changed.unchanged + changed.linked == first.files - 2
    staged = changed.path / "rootfs" / "bin"
    assert os.getxattr(staged / "f6", "user.new") == b"added later"
    assert os.getxattr(staged / "f4", "user.origin") == b"changed"
    if changed.method == "pool":  # the old entries went with the old version
        pooled = [p for p in (to / ".ocistage-pool").rglob("*") if p.is_file()]
        assert all(p.stat().st_nlink >= 2 for p in pooled)


def test_refused_xattrs_are_skipped_with_one_warning(xtree: Path, tmp_path: Path,
                                                     other_fs: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    def refuse(*args: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(xattrs.os, "setxattr", refuse)
    with caplog.at_level(logging.WARNING, logger="ocistage.stagers.directory"):
        result = _stage(xtree, other_fs, tmp_path / "cache")
    assert os.listxattr(result.path / "rootfs" / "bin" / "f4") == []
    warnings = [r.getMessage() for r in caplog.records if "extended attribute" in r.getMessage()]
    assert len(warnings) == 1 and " 3 extended attribute(s)" in warnings[0]


def test_file_capabilities_are_copied_where_permitted(tree: Path, tmp_path: Path,
                                                      other_fs: Path) -> None:
    require_root()  # setting security.capability needs root
    binary = tree / "rootfs" / "bin" / "f7"
    os.setxattr(binary, "security.capability", CAP_NET_RAW)
    result = _stage(tree, other_fs, tmp_path / "cache", link=False)
    assert os.getxattr(result.path / "rootfs" / "bin" / "f7",
                       "security.capability") == CAP_NET_RAW


@pytest.mark.parametrize("where", ["pool-other-fs", "copy"])
def test_a_manifest_without_xattrs_reads_and_counts_as_changed_once(
        xtree: Path, tmp_path: Path, other_fs: Path, where: str) -> None:
    to, link = _where(where, tmp_path, other_fs)
    cache = tmp_path / "cache"
    first = _stage(xtree, to, cache, link=link)
    # as an older ocistage wrote them: nine fields per entry, a digest without ctimes
    path = first.path / MANIFEST_NAME
    written = load_manifest(path)
    assert written is not None
    document = json.loads(b"".join(written.json_chunks()))
    document["entries"] = [row[:9] for row in document["entries"]]
    path.unlink()
    path.write_text(json.dumps(document))
    marker = json.loads((first.path / MARKER_NAME).read_bytes())
    marker["tree"] = "0" * 32
    (first.path / MARKER_NAME).unlink()
    (first.path / MARKER_NAME).write_text(json.dumps(marker))
    old = load_manifest(path)
    assert old is not None and all(e.xattrs is None for e in old.entries)
    upgraded = _stage(xtree, to, cache, link=link)
    assert upgraded.unchanged < upgraded.files  # unknown xattrs: placed again, once
    assert os.getxattr(upgraded.path / "rootfs/bin/f4", "user.origin") == b"image layer 3"
    again = _stage(xtree, to, cache, link=link)
    assert again.unchanged == again.files
