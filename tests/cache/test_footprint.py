"""The cache's footprint counts what `du` counts; dropping parts frees a shared file with the
last part that links it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ocistage.cache.footprint import measure


def du(path: Path) -> int:
    out = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0])


def test_a_file_linked_by_two_parts_is_freed_with_the_last(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    snapshot = root / "snapshots" / "s1"
    bundle = root / "bundles" / "b1"
    (snapshot / "rootfs").mkdir(parents=True)
    (bundle / "rootfs").mkdir(parents=True)
    (snapshot / "rootfs" / "big").write_bytes(os.urandom(1 << 20))
    os.link(snapshot / "rootfs" / "big", bundle / "rootfs" / "big")
    (bundle / "rootfs" / "own").write_bytes(os.urandom(100_000))
    (root / "index.json").write_text("{}")
    footprint = measure(root)
    assert footprint.size() == du(root)
    # the bundle still links big: dropping the snapshot frees its two directories
    dirs = sum(os.lstat(d).st_blocks * 512 for d in (snapshot, snapshot / "rootfs"))
    assert footprint.drop(snapshot) == dirs
    assert footprint.drop(snapshot) == footprint.drop(snapshot / ".")  # asked again: same answer
    freed = footprint.drop(bundle)
    assert freed >= (1 << 20) + 100_000
    subprocess.run(["rm", "-rf", str(snapshot), str(bundle)], check=True)
    assert footprint.size() == du(root)
    assert footprint.floor() == footprint.size()  # only index.json and directories remain


def test_skipped_and_unknown_entries(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / "odd").mkdir(parents=True)
    (root / "odd" / "f").write_bytes(b"x" * 10_000)
    (root / "gc.lock").write_text("me")
    assert measure(root).size() == du(root)
    lock = os.lstat(root / "gc.lock").st_blocks * 512
    assert measure(root, skip=("gc.lock",)).size() == du(root) - lock
    assert measure(root).drop(root / "nothing") == 0
