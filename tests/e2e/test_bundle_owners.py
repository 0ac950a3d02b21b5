"""``bundle --no-rootless`` run by root keeps the image's owners (issue 27, item 9): the tree is
what ``umoci unpack`` (as root, without ``--rootless``) makes of the same image (names, types,
modes, owners, contents), and the image user writes its own WORKDIR and HOME under root
``runc run`` (no user namespace). Rootless and owned trees never stand in for each other:
not through the cache's bundles, not through its snapshots."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ocistage.components import require_binary
from pytest_ocistage.imagebuild import BuiltImage, Dir, File, build_image, busybox_layer
from pytest_ocistage.runner import OcistageRunner
from tests.bundler.tarbuilder import add_mount_points, snapshot

pytestmark = pytest.mark.needs_root("owners from the image need root (chown)")

APP = 1000
Owners = dict[str, tuple[int, int, int, int]]  # path -> (type, mode, uid, gid)


@pytest.fixture
def base() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="ocistage-owners-", dir="/tmp"))
    try:
        yield top
    finally:
        shutil.rmtree(top)


def owned_image(layout: Path) -> BuiltImage:
    """busybox, a user ``app`` whose HOME and WORKDIR are its own, files of other owners (a
    group-writable directory, a setgid file, a mode-0 file) and a second layer that changes
    an owner and adds below a directory of the first."""
    first = busybox_layer()
    first.update({
        "home/app": Dir(0o750, APP, APP),
        "home/app/.profile": File("# app\n", 0o600, APP, APP),
        "work": Dir(0o755, APP, APP),
        "srv/shared": Dir(0o2775, 0, 50),
        "srv/shared/report": File("r\n", 0o2640, 1234, 50),
        "srv/secret": File("s\n", 0o000, 4321, 4321),
    })
    second = {"work/data.txt": File("data\n", 0o644, APP, APP),
              "srv/shared/report": File("r2\n", 0o640, 1235, 51)}
    return build_image(layout, [first, second], user="app", workdir="/work",
                       cmd=["sh", "-c", "touch /work/made $HOME/made && id -u && id -g "
                                        "&& pwd && echo $HOME"])


def owners(rootfs: Path) -> Owners:
    """Every entry below ``rootfs`` (and ``rootfs`` itself, as "."): type, mode, owner."""
    found: Owners = {}
    for directory, dirs, files in os.walk(rootfs):
        for name in [".", *dirs, *files] if directory == str(rootfs) else [*dirs, *files]:
            path = Path(directory) / name
            info = path.lstat()
            mode = 0 if stat.S_ISLNK(info.st_mode) else stat.S_IMODE(info.st_mode)
            found[str(path.relative_to(rootfs))] = (stat.S_IFMT(info.st_mode), mode,
                                                    info.st_uid, info.st_gid)
    return found


def umoci_unpack(image: BuiltImage, bundle: Path) -> Path:
    require_binary("umoci")
    subprocess.run(["umoci", "unpack", "--image", f"{image.layout}:{image.tag}", str(bundle)],
                   check=True, capture_output=True)
    return bundle / "rootfs"


def run_as_root(bundle: Path, state: Path) -> subprocess.CompletedProcess[str]:
    """The bundle under root runc without a user namespace, as a privileged runtime runs it."""
    return subprocess.run([require_binary("runc"), "--root", str(state), "run", "-b",
                           str(bundle), f"ocistage-owners-{os.getpid()}-{bundle.name}"],
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_no_rootless_bundle_has_the_images_owners_as_umoci_unpacks_them(base: Path) -> None:
    image = owned_image(base / "layout")
    ocistage = OcistageRunner.in_directory(base / "root")
    dest = base / "dest"
    ocistage.run_process("bundle", "--no-rootless", image.ref, str(dest), check=True)
    reference = add_mount_points(umoci_unpack(image, base / "umoci"))
    ours, theirs = owners(dest / "rootfs"), owners(reference)
    assert ours == theirs
    # and the rest as umoci makes it: contents, link targets, hardlinks, xattrs, times
    assert snapshot(dest / "rootfs") == snapshot(reference)
    assert ours["home/app"][2:] == (APP, APP)
    assert ours["srv/shared/report"] == (stat.S_IFREG, 0o640, 1235, 51)
    assert ours["srv/secret"] == (stat.S_IFREG, 0o000, 4321, 4321)
    assert (dest / "rootfs/work/data.txt").read_text() == "data\n"


def test_the_image_user_writes_its_workdir_and_home_under_root_runc(base: Path) -> None:
    image = owned_image(base / "layout")
    ocistage = OcistageRunner.in_directory(base / "root")
    dest = base / "dest"
    ocistage.run_process("bundle", "--no-rootless", image.ref, str(dest), check=True)
    result = run_as_root(dest, base / "state")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(APP), str(APP), "/work", "/home/app"]
    for made in ("work/made", "home/app/made"):
        assert (dest / "rootfs" / made).lstat().st_uid == APP


def test_owned_and_rootless_trees_never_stand_in_for_each_other(base: Path) -> None:
    """Each order, through cached bundles, snapshots and --link: a rootless request after an
    owned one gets the caller's files, an owned one after a rootless one the image's."""
    image = owned_image(base / "layout")
    ocistage = OcistageRunner.in_directory(base / "root")
    # a rootless DEST that keeps its snapshot: the caller's tree, in the cache
    ocistage.run_process("bundle", "--keep-snapshot", image.ref, str(base / "r1"), check=True)
    owned_cached = Path(ocistage.run_process("bundle", "--no-rootless", image.ref,
                                             check=True).stdout.strip())
    for path in (base / "owned-linked", base / "owned-copied"):
        ocistage.run_process("bundle", "--no-rootless",
                             *(["--link"] if path.name == "owned-linked" else []),
                             image.ref, str(path), check=True)
    rootless_cached = Path(ocistage.run_process("bundle", image.ref, check=True)
                           .stdout.strip())
    ocistage.run_process("bundle", "--link", image.ref, str(base / "r2"), check=True)
    assert owned_cached != rootless_cached
    for rootfs in (owned_cached / "rootfs", base / "owned-linked/rootfs",
                   base / "owned-copied/rootfs"):
        assert owners(rootfs)["home/app"][2:] == (APP, APP), rootfs
        assert owners(rootfs)["srv/secret"][2:] == (4321, 4321), rootfs
    for rootfs in (base / "r1/rootfs", rootless_cached / "rootfs", base / "r2/rootfs"):
        assert {entry[2:] for entry in owners(rootfs).values()} == {(0, 0)}, rootfs
    # the owned cached bundle is asked for again: the same one
    again = ocistage.run_process("bundle", "--no-rootless", image.ref, check=True)
    assert Path(again.stdout.strip()) == owned_cached
    # a tree whose files belong to other host users is reachable by nobody else
    for directory in (owned_cached, base / "owned-linked", base / "owned-copied"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
