"""Files their owner may not read (a ``000`` ``/etc/shadow``, a ``0200`` file), bundled by an
ordinary user (issue 34): the snapshot keeps them owner-readable and records the image's
modes, so a writable ``bundle REF DEST`` is a copy of the cached snapshot (no layer unpacked
again) with exactly the image's modes. Before, the copy (``cp -a``) could not read them as a
user, and the bundle fell back to unpacking every layer.

Run as a user the test makes (``useradd``, ``setpriv``) when pytest runs as root, else as the
user running it."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ocistage.imagebuild import WHITEOUT, File, Hardlink, build_image
from tests.bundler.tarbuilder import snapshot
from tests.cotenant import User, ordinary_user, reachable_directory

BASE = {"etc/passwd": "root:x:0:0::/root:/bin/sh\n",
        "etc/shadow": File("root:*:19000::::::\n", mode=0o000),
        "etc/shadow-link": Hardlink("etc/shadow"),
        "etc/write-only": File("written, never read\n", mode=0o200),
        "etc/gone": File("deleted by the upper layer\n", mode=0o000),
        "bin/tool": File("#!/bin/sh\n", mode=0o755)}
UPPER = {"etc/shadow-again": Hardlink("etc/shadow"),    # a lower 000 inode under a new name
         "etc/write-only": File("replaced, readable\n", mode=0o644),  # a new inode
         "etc/gone": WHITEOUT,
         "etc/gshadow": File("root:*::\n", mode=0o000)}
#: the image's modes of the files its owner may not read, in the derived image
EXPECTED = {"etc/shadow": 0o000, "etc/shadow-link": 0o000, "etc/shadow-again": 0o000,
            "etc/gshadow": 0o000, "etc/write-only": 0o644, "etc/passwd": 0o644}


@pytest.fixture
def user() -> Iterator[User]:
    with ordinary_user() as made:
        yield made


@pytest.fixture
def homes(tmp_path: Path) -> Iterator[Path]:
    """Where the user's home (with its cache), the image and the bundles are."""
    with reachable_directory(tmp_path) as directory:
        yield directory


def bundle(user: User, homes: Path, *args: str) -> dict[str, object]:
    result = user.ocistage(homes, "bundle", "--json", *args)
    assert result.returncode == 0, result.stderr
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


def modes(rootfs: Path) -> dict[str, int]:
    return {name: stat.S_IMODE(os.lstat(rootfs / name).st_mode) for name in EXPECTED}


def test_a_user_copies_unreadable_files_from_the_snapshot_with_the_image_modes(
        user: User, homes: Path) -> None:
    layout = homes / "layout"
    base = build_image(layout, [BASE], tag="base", cmd=["/bin/tool"])
    derived = build_image(layout, [BASE, UPPER], tag="derived", cmd=["/bin/tool"])
    work = user.home(homes)
    # the cached bundles: the snapshot of the base layer, then one built on it
    bundle(user, homes, base.ref)
    cached = bundle(user, homes, derived.ref)
    assert cached["layers_applied"] == 1
    linked = Path(str(cached["path"])) / "rootfs"
    # writable bundles: private copies of the snapshots, nothing unpacked again
    copies = {}
    for image in (base, derived):
        dest = work / f"copy-{image.tag}"
        made = bundle(user, homes, image.ref, str(dest))
        assert made["layers_applied"] == 0, f"{image.tag}: unpacked again, not copied"
        copies[image.tag] = dest / "rootfs"
    assert modes(copies["derived"]) == EXPECTED
    # shared with the snapshot: what its owner could not read is owner-readable there
    assert modes(linked) == {**EXPECTED, "etc/shadow": 0o400, "etc/shadow-link": 0o400,
                             "etc/shadow-again": 0o400, "etc/gshadow": 0o400}
    assert stat.S_IMODE(os.lstat(copies["base"] / "etc/write-only").st_mode) == 0o200
    # the same tree as a cold unpack of the blobs into DEST (another cache)
    for image in (base, derived):
        cold = work / f"cold-{image.tag}"
        made = bundle(user, homes, "--cache", str(work / "fresh"), image.ref, str(cold))
        assert made["layers_applied"] == len(image.layer_digests)
        assert snapshot(copies[image.tag]) == snapshot(cold / "rootfs")
    shared = {os.lstat(copies["derived"] / name).st_ino
              for name in ("etc/shadow", "etc/shadow-link", "etc/shadow-again")}
    assert len(shared) == 1  # one inode in the copy, as in the image
    assert shared.isdisjoint({os.lstat(linked / "etc/shadow").st_ino})
