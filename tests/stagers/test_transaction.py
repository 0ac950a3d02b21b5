"""ocistage.stagers.transaction: the one staging sequence every format and source goes through."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache import leases
from ocistage.cache.leases import Holder
from ocistage.cache.targetlayout import POOL_DIR, TMP_DIR
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.errors import StageError
from ocistage.stagers.remote import push_tree, stage_from_url
from ocistage.stagers.transaction import Staging
from pytest_ocistage.components import require_binary, require_root


def _pin() -> Holder:
    return Holder.pin("test")


def test_a_failure_inside_drops_scratch_and_lease_and_unlocks(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    failed = pytest.raises(StageError, match=r"staging src to .*/t/x failed: Permission denied")
    with failed, Staging(tmp_path / "t", "x", cache_root=cache, holder=_pin(),
                         what="src") as staging:
        scratch = staging.scratch()
        (scratch / "half").write_text("written before the failure")
        raise PermissionError(13, "Permission denied")
    # no scratch, no owner, no lock: and so no scratch dir of the target
    assert not os.path.lexists(tmp_path / "t" / TMP_DIR)
    assert leases.all_leases(cache) == []
    with Staging(tmp_path / "t", "x", cache_root=cache, holder=_pin(), what="src"):
        pass  # the lock was released


def test_an_empty_directory_is_taken_over_only_as_an_unmounted_image(tmp_path: Path) -> None:
    """Directory, squashfs and URL staging used to disagree about an empty TO/NAME."""
    cache = tmp_path / "cache"
    (tmp_path / "t" / "x").mkdir(parents=True)
    with Staging(tmp_path / "t", "x", cache_root=cache, holder=_pin(), what="s") as staging:
        with pytest.raises(StageError, match="not staged by ocistage"):
            staging.refuse_foreign("dir")
        with pytest.raises(StageError, match="not staged by ocistage"):
            staging.refuse_foreign("squashfs")
    (tmp_path / "t" / "x.sqfs").write_bytes(b"an image whose mount went away")
    with Staging(tmp_path / "t", "x", cache_root=cache, holder=_pin(), what="s") as staging:
        staging.refuse_foreign("squashfs")
        with pytest.raises(StageError, match="holds a staged squashfs image"):
            staging.refuse_foreign("dir")


def test_a_url_stage_refuses_a_directory_bundle_by_its_format(tree: Path,
                                                              tmp_path: Path) -> None:
    require_binary("mksquashfs")
    cache = tmp_path / "cache"
    pushed = push_tree(tree, f"file://{tmp_path}/store", "img", format="squashfs",
                       work=tmp_path, label="tree")
    stage_directory(tree, tmp_path / "t", cache_root=cache, name="img", holder=_pin())
    with pytest.raises(StageError, match="holds a staged directory bundle"):
        stage_from_url(pushed.url, tmp_path / "t", cache_root=cache, holder=_pin())


def test_a_target_that_is_a_file_is_named_as_such(tree: Path, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    for to in (afile, afile / "below"):
        with pytest.raises(StageError, match="is not a directory") as caught:
            stage_directory(tree, to, cache_root=tmp_path / "cache", holder=_pin())
        assert "source is readable" not in str(caught.value.hint)
    with pytest.raises(StageError, match="is not a directory"):
        stage_from_url("file:///x/y.sqfs", afile, cache_root=tmp_path / "cache", holder=_pin())


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (root only), unmounted afterwards."""
    require_root()  # mounting a small tmpfs needs root
    mountpoint = tmp_path / f"small-{uuid.uuid4().hex[:6]}"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", os.fspath(mountpoint)],
                   check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", os.fspath(mountpoint)], check=True)


@pytest.mark.parametrize("link", [None, False])
def test_a_full_disk_is_one_clean_error_and_leaves_nothing(tmp_path: Path, small_fs: Path,
                                                           link: bool | None) -> None:
    source = tmp_path / "big"
    (source / "rootfs").mkdir(parents=True)
    for n in range(40):  # 40 distinct 64 KiB files: 2.5 MiB on a 1 MiB filesystem
        (source / "rootfs" / f"f{n}").write_bytes(os.urandom(64 << 10))
    cache = tmp_path / "cache"
    with pytest.raises(StageError) as caught:
        stage_directory(source, small_fs / "t", cache_root=cache, holder=_pin(), link=link)
    assert "no space left" in caught.value.message and "(None)" not in caught.value.message
    assert caught.value.hint is not None and "free space" in caught.value.hint
    target = small_fs / "t"
    assert not (target / "big").exists()
    assert not os.path.lexists(target / TMP_DIR)
    pooled = [name for _, _, files in os.walk(target / POOL_DIR) for name in files]
    assert pooled == []
    assert leases.all_leases(cache) == []
