"""Owners in a bundle: ``--no-rootless`` made by root has the image's uid/gid on every entry
(and its device nodes), straight from the blobs, never through a snapshot; rootless bundles keep
the caller's, also after an owned one; anyone else asking for ``--no-rootless`` gets a warning
(issue 27, item 9). The e2e twin (tests/e2e/test_bundle_owners.py) compares with umoci and runs
the bundle under root runc."""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path

import pytest

from ocistage.bundler.flows.bundle import _bundle_key, _owners, make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.cache.digest import Digest
from ocistage.cache.notice import Kind
from ocistage.cache.snapshots import list_snapshots
from ocistage.cache.store import Store
from tests.bundler.tarbuilder import build_tar, chardev, directory, file, write_oci_layout

LOWER = build_tar([
    directory("home"), directory("home/app", mode=0o750, uid=1000, gid=1000),
    file("home/app/.profile", b"p", mode=0o600, uid=1000, gid=1000),
    directory("srv", mode=0o2775, gid=50), file("srv/report", b"r", mode=0o640, uid=1234, gid=50),
    directory("dev"), chardev("dev/null"),
])
UPPER = build_tar([file("srv/report", b"r2", mode=0o640, uid=1235, gid=51),
                   file("home/app/made", b"m", uid=1000, gid=1000)])
RUN = ConfigOptions(args=["/bin/true"])
OWNED = dataclasses.replace(RUN, rootless=False)

root_only = pytest.mark.needs_root("the image's owners need root")


def image(tmp_path: Path) -> str:
    write_oci_layout(tmp_path / "layout", [LOWER, UPPER], tag="t")
    return f"oci:{tmp_path / 'layout'}:t"


def owners(rootfs: Path) -> dict[str, tuple[int, int]]:
    found = {".": (rootfs.lstat().st_uid, rootfs.lstat().st_gid)}
    for path in rootfs.rglob("*"):
        info = path.lstat()
        found[str(path.relative_to(rootfs))] = (info.st_uid, info.st_gid)
    return found


def make(store: Store, ref: str, dest: Path | None, options: ConfigOptions,
         **kw: bool) -> tuple[Path, int]:
    result = make_bundle(parse_reference(ref), store, dest, config_options=options, **kw)
    return result.path, result.layers_applied


@root_only
@pytest.mark.parametrize("link", [False, True])
def test_no_rootless_as_root_restores_the_images_owners(tmp_path: Path, link: bool) -> None:
    store = Store.open(tmp_path / "cache")
    ref = image(tmp_path)
    # a rootless bundle first: its snapshot (the caller's files) must not serve the next
    make(store, ref, tmp_path / "rootless", RUN, keep_snapshot=True)
    path, applied = make(store, ref, tmp_path / "owned", OWNED, link=link)
    assert applied == 2  # unpacked again, with owners: not cloned from the snapshot
    found = owners(path / "rootfs")
    assert found["home/app"] == found["home/app/.profile"] == found["home/app/made"] \
        == (1000, 1000)
    assert found["srv"] == (0, 50) and found["srv/report"] == (1235, 51)
    assert stat.S_ISCHR((path / "rootfs/dev/null").lstat().st_mode)
    assert stat.S_IMODE((path / "rootfs/home/app").stat().st_mode) == 0o750  # exact
    assert set(owners(tmp_path / "rootless" / "rootfs").values()) == {(0, 0)}
    assert len(list_snapshots(store)) == 1  # only the rootless one: none of owned trees


@root_only
def test_cached_owned_and_rootless_bundles_are_apart(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    ref = image(tmp_path)
    owned, _ = make(store, ref, None, OWNED)
    rootless, applied = make(store, ref, None, RUN)
    assert owned != rootless and applied == 2  # the owned bundle left no snapshot to clone
    assert owners(owned / "rootfs")["srv/report"] == (1235, 51)
    assert set(owners(rootless / "rootfs").values()) == {(0, 0)}
    assert stat.S_IMODE(owned.stat().st_mode) == 0o700
    again, applied = make(store, ref, None, OWNED)
    assert (again, applied) == (owned, 0)


def test_the_key_of_an_owned_bundle_is_its_own() -> None:
    digest = Digest("sha256", "a" * 64)
    keys = {_bundle_key(digest, RUN), _bundle_key(digest, OWNED),
            _bundle_key(digest, OWNED, owners=True)}
    assert len(keys) == 3
    assert _bundle_key(digest, RUN) == _bundle_key(digest, RUN, owners=False)


def test_who_gets_the_images_owners() -> None:
    assert _owners(RUN, euid=0) == (False, ())
    assert _owners(OWNED, euid=0) == (True, ())
    owned, notices = _owners(OWNED, euid=1000)
    assert owned is False
    assert [notice.kind for notice in notices] == [Kind.OWNERS]
    assert "--no-rootless" in notices[0].text and "root" in notices[0].text


def test_an_option_added_later_keys_a_bundle_only_when_set() -> None:
    """A cache made before ``--map-self`` existed keeps its bundles: the key of a bundle
    without it is the key that code computed (its fields, no ``map_self``); with it, another."""
    import dataclasses
    import hashlib
    import json

    from ocistage.bundler.flows.bundle import BUNDLE_FORMAT

    digest = Digest("sha256", "b" * 64)
    before = {k: v for k, v in dataclasses.asdict(RUN).items() if k != "map_self"}
    old = hashlib.sha256(json.dumps({"format": BUNDLE_FORMAT, "manifest": str(digest),
                                     "options": before}, sort_keys=True,
                                    default=str).encode()).hexdigest()
    assert _bundle_key(digest, RUN) == old
    assert _bundle_key(digest, dataclasses.replace(RUN, map_self=True)) != old
