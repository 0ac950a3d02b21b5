"""A hostile co-tenant (a second uid through ``setpriv``) against what ocistage run as root
writes into or removes from directories others can write (issue 13.1, 13.2)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from tests.bundler.tarbuilder import build_tar, file, write_oci_layout
from tests.cotenant import NOBODY, NOBODY_USER, as_nobody, second_user, sticky_directory
from tests.e2e.conftest import OcistageRunner

pytestmark = second_user



@pytest.fixture
def shared() -> Iterator[Path]:
    """A sticky, world-writable directory like /tmp or /scratch (pytest's tmp_path is
    private to its owner)."""
    with sticky_directory("ocistage-cotenant-") as directory:
        yield directory


@pytest.fixture
def root_only(tmp_path: Path) -> Path:
    """A directory only root may change, with a file the attack aims at."""
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "precious").write_text("keep me")
    return secret


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def small_image(tmp_path: Path) -> str:
    layout = tmp_path / "layout"
    write_oci_layout(layout, [build_tar([file("bin/sh", b"#!/bin/true\n", 0o755)])],
                     tag="small")
    return f"oci:{layout}:small"


def test_a_planted_dead_looking_scratch_dir_beside_dest_is_not_touched(
        tmp_path: Path, ocistage: OcistageRunner, shared: Path, root_only: Path) -> None:
    planted = shared / f".dest.ocistage-{socket.gethostname()}-{dead_pid()}-0badc0de"
    as_nobody("mkdir", "-p", f"{planted}/sub")
    as_nobody("touch", f"{planted}/sub/theirs")
    # the link is there before ocistage looks: a removal following it would empty root-only
    as_nobody("ln", "-s", str(root_only), f"{planted}/link")
    os.symlink(root_only, planted / "rootlink")  # even a link root planted is not followed
    made = ocistage("bundle", small_image(tmp_path), str(shared / "dest"), "--cmd", "/bin/sh")
    assert made.returncode == 0, made.stderr
    assert (shared / "dest" / "rootfs" / "bin" / "sh").is_file()
    assert (root_only / "precious").read_text() == "keep me"
    assert sorted(p.name for p in planted.iterdir()) == ["link", "rootlink", "sub"]
    assert (planted / "sub" / "theirs").exists()


@pytest.fixture
def shm_shared() -> Iterator[Path]:
    """A sticky, world-writable directory on another filesystem than the bundles (tmpfs), so
    that staging goes through the target's pool."""
    base = Path(tempfile.mkdtemp(prefix="ocistage-cotenant-", dir="/dev/shm"))
    base.chmod(0o755)
    (base / "shared").mkdir()
    (base / "shared").chmod(0o1777)
    yield base / "shared"
    shutil.rmtree(base)


IMAGE_FILES = {"bin/sh": (b"#!/bin/true\n", 0o755), "etc/motd": (b"hello from the image\n", 0o644)}


def files_image(tmp_path: Path) -> str:
    layout = tmp_path / "layout-files"
    write_oci_layout(layout, [build_tar([file(name, data, mode)
                                         for name, (data, mode) in IMAGE_FILES.items()])],
                     tag="files")
    return f"oci:{layout}:files"


def plant_pool(pool: Path, outside: Path) -> None:
    """As the co-tenant: pool entries under the keys of the image's files (computable from
    the public image), holding planted bytes, and one that is a symlink to ``outside``."""
    as_nobody("mkdir", "-p", str(pool))
    for index, (data, mode) in enumerate(IMAGE_FILES.values()):
        key = f"{xxhash.xxh3_128_hexdigest(data)}-{mode:04o}"
        as_nobody("mkdir", "-p", str(pool / key[:2]))
        if index == 0:
            as_nobody("ln", "-s", str(outside), str(pool / key[:2] / key))
        else:
            as_nobody("sh", "-c", f"printf planted > {pool / key[:2] / key}; "
                                  f"chmod {mode:o} {pool / key[:2] / key}")


def assert_no_planted_data(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert path.read_bytes() != b"planted", path


def test_a_target_another_user_made_first_is_refused(
        tmp_path: Path, ocistage: OcistageRunner, shm_shared: Path) -> None:
    bundle = tmp_path / "bundle"
    ocistage("bundle", files_image(tmp_path), str(bundle), "--cmd", "/bin/sh", check=True)
    target = shm_shared / "target"
    as_nobody("mkdir", str(target))
    plant_pool(target / ".ocistage-pool", tmp_path)
    result = ocistage("stage", str(bundle), "--to", str(target))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"refusing stage target {target}" in result.stderr
    assert "nobody (uid 65534)" in result.stderr
    assert sorted(p.name for p in target.iterdir()) == [".ocistage-pool"]


@pytest.mark.parametrize("planted", [".ocistage-pool", ".ocistage-tmp"])
def test_a_pool_or_tmp_another_user_made_in_a_sticky_target_is_refused(
        tmp_path: Path, ocistage: OcistageRunner, shm_shared: Path, planted: str) -> None:
    """In a shared target root's pool and scratch dir are ``.ocistage-pool-0`` and
    ``.ocistage-tmp-0``: one the co-tenant made first (with entries under the image's keys)
    stops the stage with one error naming them and a hint; the plain names, which are
    nobody's own there, are not in the way."""
    bundle = tmp_path / "bundle"
    ocistage("bundle", files_image(tmp_path), str(bundle), "--cmd", "/bin/sh", check=True)
    squatted = shm_shared / f"{planted}-{os.geteuid()}"
    for path in (shm_shared / planted, squatted):
        if planted == ".ocistage-pool":
            plant_pool(path, tmp_path)
        else:
            as_nobody("mkdir", str(path))
    result = ocistage("stage", str(bundle), "--to", str(shm_shared), "--name", "mine")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{squatted}: it is owned by nobody (uid 65534)" in result.stderr
    assert "hint: another user made that name first" in result.stderr
    assert not (shm_shared / "mine").exists()
    assert sorted(os.listdir(shm_shared)) == sorted([planted, squatted.name])
    as_nobody("rm", "-r", str(squatted))  # as an administrator would have them
    staged = json.loads(ocistage("stage", str(bundle), "--to", str(shm_shared), "--name",
                                 "mine", "--json", check=True).stdout)
    assert staged["method"] == "pool"
    assert_no_planted_data(shm_shared / "mine" / "rootfs")
    assert sorted(os.listdir(shm_shared)) == sorted(
        {planted, f".ocistage-pool-{os.geteuid()}", "mine"})


def test_root_and_a_cotenant_stage_an_image_into_one_sticky_target_at_once(
        ocistage: OcistageRunner, shm_shared: Path) -> None:
    """``stage REF`` (pull, bundle, stage) by root and by nobody, each with their own cache,
    at once and then again, into one sticky target (issue 39): both are staged, each
    through their own scratch dir, and none stays."""
    public = shm_shared.parent / "public"  # the layout and nobody's home: all may read it
    public.mkdir()
    write_oci_layout(public / "layout", [build_tar([
        file(name, data, mode) for name, (data, mode) in IMAGE_FILES.items()])],
        tag="files", container={"Cmd": ["/bin/sh"]})
    ref = f"oci:{public / 'layout'}:files"
    subprocess.run(["chmod", "-R", "a+rX", str(public)], check=True)
    for _ in range(2):
        theirs = NOBODY_USER.start(public, "stage", ref, "--to", str(shm_shared), "--name",
                                   "theirs")
        mine = ocistage("stage", ref, "--to", str(shm_shared), "--name", "mine")
        _, err = theirs.communicate(timeout=300)
        assert theirs.returncode == 0, err
        assert mine.returncode == 0, mine.stderr
    for name, uid in (("theirs", NOBODY), ("mine", os.geteuid())):
        assert (shm_shared / name).stat().st_uid == uid
        motd = shm_shared / name / "rootfs" / "etc" / "motd"
        assert motd.read_bytes() == IMAGE_FILES["etc/motd"][0] and motd.stat().st_uid == uid
    # root's cache is on another filesystem (its pool); nobody's beside the target (links)
    assert sorted(os.listdir(shm_shared)) == sorted(
        [f".ocistage-pool-{os.geteuid()}", "mine", "theirs"])


def test_planted_retired_versions_in_a_sticky_target_are_left_alone(
        tmp_path: Path, ocistage: OcistageRunner, shared: Path, root_only: Path) -> None:
    """A co-tenant plants entries named like retired versions of our bundle in a sticky
    target (a directory of theirs with a file in it, a symlink to a directory only root may
    change): staging again and unstaging sweep only retired versions that are ours, so they
    neither fail nor touch the co-tenant's files or what the link points at."""
    tree = tmp_path / "tree"
    (tree / "rootfs").mkdir(parents=True)
    (tree / "rootfs" / "file").write_text("x")
    (tree / "config.json").write_text("{}")
    theirs = shared / ".ocistage-retired-mine.0123456789"
    as_nobody("mkdir", "-m", "0777", str(theirs))
    as_nobody("touch", str(theirs / "their-file"))
    link = shared / ".ocistage-retired-mine.abcdefabcd"
    as_nobody("ln", "-s", str(root_only), str(link))
    for text in ("one", "two"):  # the second stage replaces a version
        (tree / "rootfs" / "file").write_text(text)
        ocistage("stage", str(tree), "--to", str(shared), "--name", "mine", check=True)
    ocistage("unstage", str(shared / "mine"), check=True)
    assert (theirs / "their-file").exists()
    assert link.is_symlink() and (root_only / "precious").read_text() == "keep me"


def test_pool_entries_that_fail_verification_are_never_linked(
        tmp_path: Path, ocistage: OcistageRunner, shm_shared: Path) -> None:
    """In the caller's own pool, entries under the right keys with the wrong owner, type or
    content (as only root or the caller could make them) are ignored: private copies."""
    bundle = tmp_path / "bundle"
    ocistage("bundle", files_image(tmp_path), str(bundle), "--cmd", "/bin/sh", check=True)
    target = shm_shared / "target"
    target.mkdir()
    pool = target / ".ocistage-pool"
    keys = []
    for data, mode in IMAGE_FILES.values():
        key = f"{xxhash.xxh3_128_hexdigest(data)}-{mode:04o}"
        (pool / key[:2]).mkdir(parents=True, exist_ok=True)
        keys.append(pool / key[:2] / key)
    keys[0].symlink_to(tmp_path)
    keys[1].write_bytes(b"planted")
    keys[1].chmod(0o644)
    extra = IMAGE_FILES["etc/motd"]
    for staged_name in ("first", "second"):
        staged = json.loads(ocistage("stage", str(bundle), "--to", str(target), "--name",
                                     staged_name, "--json", check=True).stdout)
        assert staged["method"] == "pool"
        rootfs = Path(staged["path"]) / "rootfs"
        assert (rootfs / "etc" / "motd").read_bytes() == extra[0]
        assert (rootfs / "bin" / "sh").read_bytes() == IMAGE_FILES["bin/sh"][0]
        assert_no_planted_data(rootfs)
    os.chown(keys[1], NOBODY, NOBODY)  # right content, but another user's
    keys[1].write_bytes(extra[0])
    third = json.loads(ocistage("stage", str(bundle), "--to", str(target), "--name", "third",
                                "--json", check=True).stdout)
    motd = Path(third["path"]) / "rootfs" / "etc" / "motd"
    assert motd.read_bytes() == extra[0] and motd.stat().st_uid == os.geteuid()


def test_a_restage_does_not_link_a_pool_entry_replaced_since(
        tmp_path: Path, ocistage: OcistageRunner, shm_shared: Path) -> None:
    """Unchanged files of a re-stage are linked from the pool by key: an entry that is no
    longer the inode the previous version linked is hashed first, and not linked if wrong."""
    bundle = tmp_path / "bundle"
    ocistage("bundle", files_image(tmp_path), str(bundle), "--cmd", "/bin/sh", check=True)
    target = shm_shared / "target"
    first = json.loads(ocistage("stage", str(bundle), "--to", str(target), "--json",
                                check=True).stdout)
    data, mode = IMAGE_FILES["etc/motd"]
    key = f"{xxhash.xxh3_128_hexdigest(data)}-{mode:04o}"
    entry = target / ".ocistage-pool" / key[:2] / key
    assert entry.stat().st_nlink == 2  # the pool's name and the staged file
    entry.unlink()
    entry.write_bytes(b"planted")  # same name, same owner and mode, other inode and bytes
    entry.chmod(mode)
    (bundle / "rootfs" / "bin" / "new").write_bytes(b"a change, so the tree is staged again")
    again = json.loads(ocistage("stage", str(bundle), "--to", str(target), "--json",
                                check=True).stdout)
    assert again["path"] == first["path"] and again["method"] == "pool"
    rootfs = Path(again["path"]) / "rootfs"
    assert (rootfs / "etc" / "motd").read_bytes() == data
    assert_no_planted_data(rootfs)
