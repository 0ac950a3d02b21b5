"""Hard links across two mount points of one filesystem (issue 12.3): ``st_dev`` is the same,
``link()`` fails with EXDEV. Staging (hardlink and pool), ``bundle --link`` and the pool fall
back to copies. Run as root in a child with its own mount namespace (``unshare --mount
--propagation private`` + ``mount --bind``), so the host's mounts are never touched."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.bundler.tarbuilder import build_tar, file, write_oci_layout
from tests.e2e.conftest import OcistageRunner

pytestmark = pytest.mark.needs_root("bind mounts in a private mount namespace")


def in_mount_namespace(ocistage: OcistageRunner, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh; ``$OCISTAGE`` is the CLI) in a new, private mount namespace: its
    bind mounts vanish with it."""
    env = ocistage.environment({"OCISTAGE": shlex.join(ocistage.command)})
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-euc",
                           script], env=env, cwd=ocistage.cwd, capture_output=True, text=True,
                          timeout=600, check=False)


def image(tmp_path: Path) -> str:
    layout = tmp_path / "layout"
    write_oci_layout(layout, [build_tar([file("bin/sh", b"#!/bin/true\n", 0o755),
                                         file("etc/data", b"data " * 1000)])], tag="small")
    return f"oci:{layout}:small"


def test_stage_and_bundle_link_fall_back_to_copies_across_bind_mounts(
        tmp_path: Path, ocistage: OcistageRunner) -> None:
    ref = image(tmp_path)
    disk, mnt, pools = tmp_path / "disk", tmp_path / "mnt", tmp_path / "pools"
    for directory in (disk, mnt, pools):
        directory.mkdir()
    ocistage("bundle", ref, str(disk / "bundle"), "--cmd", "/bin/sh", check=True)
    cached = json.loads(ocistage("bundle", ref, "--cmd", "/bin/sh", "--json",
                                 check=True).stdout)["path"]
    (disk / "pooled" / ".ocistage-pool").mkdir(parents=True)
    assert os.stat(disk).st_dev == os.stat(tmp_path).st_dev == os.stat(pools).st_dev
    q = shlex.quote
    result = in_mount_namespace(ocistage, f"""
        mount --bind {q(str(disk))} {q(str(mnt))}
        mount --bind {q(str(pools))} {q(str(mnt / "pooled" / ".ocistage-pool"))}
        $OCISTAGE stage {q(str(disk / "bundle"))} --to {q(str(mnt / "target"))} --json \\
            > {q(str(tmp_path / "plain.json"))}
        $OCISTAGE stage {q(cached)} --to {q(str(mnt / "target"))} --name cached --json \\
            > {q(str(tmp_path / "cached.json"))}
        $OCISTAGE stage {q(cached)} --to {q(str(mnt / "pooled"))} --name cached --json \\
            > {q(str(tmp_path / "pooled.json"))}
        $OCISTAGE bundle {q(ref)} {q(str(mnt / "linked"))} --link --cmd /bin/sh
        if $OCISTAGE stage {q(cached)} --to {q(str(mnt / "target"))} --name forced --link \\
            2> {q(str(tmp_path / "forced.err"))}; then exit 9; fi
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    for name, staged_name in (("plain", "bundle"), ("cached", "cached")):
        doc = json.loads((tmp_path / f"{name}.json").read_text())
        assert doc["method"] == "pool"  # the probe found no links possible
        rootfs = disk / "target" / staged_name / "rootfs"
        assert (rootfs / "etc" / "data").read_bytes() == b"data " * 1000
    pooled = json.loads((tmp_path / "pooled.json").read_text())
    assert pooled["method"] == "pool" and pooled["copied"] >= 2
    assert (disk / "pooled" / "cached" / "rootfs" / "etc" / "data").read_bytes() \
        == b"data " * 1000
    assert list(pools.rglob("*")) == [] or all(p.is_dir() for p in pools.rglob("*"))
    linked = disk / "linked"
    assert (linked / "rootfs" / "etc" / "data").read_bytes() == b"data " * 1000
    config = json.loads((linked / "config.json").read_text())
    assert config["root"].get("readonly") is not True  # a copy: no reason to make it read-only
    assert "different filesystems or mount points" in (tmp_path / "forced.err").read_text()


def test_files_on_a_mount_inside_the_source_are_copied_by_a_hardlink_stage(
        tmp_path: Path, ocistage: OcistageRunner) -> None:
    """The target takes links from the source's top (method hardlink: a bundle in the cache,
    the only source that is hard-linked), but a directory of the source is a bind mount: its
    files give EXDEV one by one and are copied instead."""
    other = tmp_path / "other"
    bundle = Path(json.loads(ocistage("bundle", image(tmp_path), "--cmd", "/bin/sh", "--json",
                                      check=True).stdout)["path"])
    (bundle / "rootfs" / "mnt").mkdir()
    other.mkdir()
    for n in range(3):
        (other / f"f{n}").write_bytes(b"mounted %d" % n)
    q = shlex.quote
    result = in_mount_namespace(ocistage, f"""
        mount --bind {q(str(other))} {q(str(bundle / "rootfs" / "mnt"))}
        $OCISTAGE stage {q(str(bundle))} --to {q(str(tmp_path / "target"))} --json \\
            > {q(str(tmp_path / "staged.json"))}
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads((tmp_path / "staged.json").read_text())
    assert doc["method"] == "hardlink" and doc["copied"] >= 3
    staged = Path(doc["path"]) / "rootfs"
    for n in range(3):
        copy = staged / "mnt" / f"f{n}"
        assert copy.read_bytes() == b"mounted %d" % n
        assert copy.stat().st_ino != (other / f"f{n}").stat().st_ino
    assert (staged / "etc" / "data").stat().st_ino \
        == (bundle / "rootfs" / "etc" / "data").stat().st_ino  # linked where links work
