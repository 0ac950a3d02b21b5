"""Deep and long trees from a layer, end to end (issue 13.5): a 400-level directory chain and
a path longer than PATH_MAX (17 names of 250 bytes) unpacked from a layer are bundled,
measured by `cache du` and removed by `cache gc` and `cache rm`, and the same trees in a
staged bundle are removed by `unstage` — no RecursionError, no ENAMETOOLONG, nothing left behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ocistage.cache.treewalk import path_stats
from tests.bundler.tarbuilder import (
    DEFAULT_MOUNT_POINTS,
    build_tar,
    directory,
    file,
    write_oci_layout,
)
from tests.cache.deeptree import make_chain
from tests.e2e.conftest import OcistageRunner

CHAINS = {"deep": (400, 8), "long": (17, 250)}


def chain_layer(depth: int, name_length: int) -> bytes:
    entries = [file("bin/sh", b"#!/bin/true\n", 0o755)]
    path = ""
    for level in range(depth):
        path = f"{path}/{f'd{level}'.ljust(name_length, 'x')}".lstrip("/")
        entries.append(directory(path))
    entries.append(file(f"{path}/bottom", b"b" * 4096))
    return build_tar(entries)


def image(tmp_path: Path, kind: str) -> str:
    depth, name_length = CHAINS[kind]
    layout = tmp_path / f"layout-{kind}"
    write_oci_layout(layout, [chain_layer(depth, name_length)], tag=kind)
    return f"oci:{layout}:{kind}"


def du(ocistage: OcistageRunner) -> dict[str, dict[str, int]]:
    return json.loads(ocistage("cache", "du", "--json", check=True).stdout)  # type: ignore


def no_traceback(*outputs: str) -> None:
    for output in outputs:
        assert "Traceback" not in output and "RecursionError" not in output


@pytest.mark.parametrize("kind", sorted(CHAINS))
def test_a_deep_or_long_tree_is_measured_and_removed_by_gc_and_rm(
        tmp_path: Path, ocistage: OcistageRunner, kind: str) -> None:
    ref = image(tmp_path, kind)
    made = ocistage("bundle", ref, "--cmd", "/bin/sh", "--json")
    # GNU cp cannot clone a path longer than PATH_MAX: the bundle is unpacked instead
    no_traceback(made.stdout, made.stderr)
    assert made.returncode == 0, made.stderr
    depth, _ = CHAINS[kind]
    bundle = Path(json.loads(made.stdout)["path"])
    # root, bin, sh, bottom and the mount points the bundle adds
    assert len(list(path_stats(bundle / "rootfs"))) == depth + 4 + len(DEFAULT_MOUNT_POINTS)
    usage = du(ocistage)
    assert usage["snapshots"]["count"] == 1 and usage["bundles"]["count"] == 1
    assert usage["snapshots"]["logical"] >= 4096 and usage["bundles"]["logical"] >= 4096
    gc = ocistage("cache", "gc", "--older-than", "0s")
    no_traceback(gc.stdout, gc.stderr)
    assert gc.returncode == 0, gc.stderr
    usage = du(ocistage)
    assert usage["bundles"]["count"] == 0 and usage["snapshots"]["count"] == 0
    assert list((ocistage.cache / "tmp").iterdir()) == []
    ocistage("bundle", ref, "--cmd", "/bin/sh")
    assert du(ocistage)["snapshots"]["count"] == 1
    removed = ocistage("cache", "rm", ref)
    no_traceback(removed.stdout, removed.stderr)
    assert removed.returncode == 0, removed.stderr
    assert "File name too long" not in gc.stderr + removed.stderr
    assert du(ocistage)["snapshots"]["count"] == 0
    assert list((ocistage.cache / "tmp").iterdir()) == []


@pytest.mark.parametrize("kind", sorted(CHAINS))
def test_a_deep_or_long_tree_is_unstaged(tmp_path: Path, ocistage: OcistageRunner,
                                         kind: str) -> None:
    small = tmp_path / "layout-small"
    write_oci_layout(small, [build_tar([file("bin/sh", b"#!/bin/true\n", 0o755)])],
                     tag="small")
    bundle = tmp_path / "bundle"
    ocistage("bundle", f"oci:{small}:small", str(bundle), "--cmd", "/bin/sh", check=True)
    target = tmp_path / "target"
    staged = json.loads(ocistage("stage", str(bundle), "--to", str(target), "--json",
                                 check=True).stdout)
    path = Path(staged["path"])
    make_chain(path / "rootfs", *CHAINS[kind])  # the tree a job left in its bundle
    result = ocistage("unstage", str(path))
    no_traceback(result.stdout, result.stderr)
    assert result.returncode == 0, result.stderr
    assert not path.exists()
    assert [p for p in os.listdir(target) if not p.startswith(".ocistage-")] == []
