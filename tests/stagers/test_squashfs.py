"""--format squashfs: images built with mksquashfs, mounted with squashfuse or unpacked."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ocistage.cache import leases
from ocistage.cache.leases import Holder
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.filemanifest import MARKER_NAME, fill_hashes, scan
from ocistage.stagers.markers import Marker
from ocistage.stagers.unstage import unstage
from pytest_ocistage.components import require_binary, require_root
from tests.cotenant import require_python_for
from tests.removers import settle
from tests.stagers.conftest import require_fuse_mount

REPO = Path(__file__).resolve().parents[2]


def _view(root: Path) -> dict[str, tuple[object, ...]]:
    entries, _ = fill_hashes(root, scan(root), None, jobs=1)
    return {e.path: (e.type, e.mode, e.hash, e.target) for e in entries
            if e.path != "config.json"}


def test_unpacked_image_reproduces_the_tree(tree: Path, tmp_path: Path) -> None:
    require_binary("mksquashfs")
    require_binary("unsquashfs")
    cache = tmp_path / "cache"
    result = stage_directory(tree, tmp_path / "t", cache_root=cache, format="squashfs",
                             squashfs_mount=False, holder=Holder.pin("sq"))
    assert result.method == "squashfs-unpack"
    assert (tmp_path / "t" / "bundle.sqfs").is_file()
    assert _view(result.path) == _view(tree)
    assert json.loads((result.path / "config.json").read_text())["root"]["readonly"] is True
    marker = Marker.from_json((result.path / MARKER_NAME).read_bytes())
    assert marker.id == result.lease_id and marker.image == "bundle.sqfs"
    again = stage_directory(tree, tmp_path / "t", cache_root=cache, format="squashfs",
                            squashfs_mount=False, holder=Holder.pin("sq"))
    assert again.unchanged == result.files and again.copied == 0
    (tree / "rootfs" / "bin" / "f4").write_text("changed\n")
    changed = stage_directory(tree, tmp_path / "t", cache_root=cache, format="squashfs",
                              squashfs_mount=False, holder=Holder.pin("sq"))
    assert changed.copied == changed.files
    assert (changed.path / "rootfs" / "bin" / "f4").read_text() == "changed\n"
    assert unstage(changed.path, cache_root=cache)
    settle(cache)  # the remover of the replaced version
    assert sorted(os.listdir(tmp_path / "t")) == []
    assert leases.leases_on(cache, f"staged:{changed.path}") == []


def test_mounted_image_is_the_tree_and_unstage_unmounts(tree: Path, tmp_path: Path) -> None:
    require_fuse_mount()
    cache = tmp_path / "cache"
    result = stage_directory(tree, tmp_path / "t", cache_root=cache, format="squashfs",
                             squashfs_mount=True)
    try:
        assert result.method == "squashfs-mount"
        assert os.path.ismount(result.path)
        assert _view(result.path) == _view(tree)
        again = stage_directory(tree, tmp_path / "t", cache_root=cache, format="squashfs")
        assert again.unchanged == result.files and again.method == "squashfs-mount"
    finally:
        removed = unstage(result.path, cache_root=cache)
    assert removed
    assert not os.path.ismount(result.path) and not os.path.lexists(result.path)
    assert not (tmp_path / "t" / "bundle.sqfs").exists()


def test_missing_mountpoints_are_listed_parents_first(tmp_path: Path) -> None:
    from ocistage.stagers.squashfs import missing_mountpoints

    bundle = tmp_path / "b"
    (bundle / "rootfs" / "dev").mkdir(parents=True)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup"},
        {"destination": "/etc/hosts", "type": "bind", "source": str(hosts)},
        {"destination": "/../../escape", "type": "bind", "source": "/"},
        {"destination": "/with space", "type": "bind", "source": "/"},
    ]}))
    assert missing_mountpoints(bundle) == [
        (("rootfs", "proc"), "d"), (("rootfs", "sys"), "d"), (("rootfs", "sys", "fs"), "d"),
        (("rootfs", "sys", "fs", "cgroup"), "d"), (("rootfs", "etc"), "d"),
        (("rootfs", "etc", "hosts"), "f"), (("rootfs", "with space"), "d")]


@pytest.mark.parametrize("mounts", [["/proc"], [{"destination": "/proc"}, 7], "proc",
                                    {"destination": "/proc"}])
def test_mounts_that_are_not_objects_are_a_stage_error(tmp_path: Path, mounts: object) -> None:
    from ocistage.stagers.errors import StageError
    from ocistage.stagers.squashfs import missing_mountpoints

    bundle = tmp_path / "b"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"},
                                                    "mounts": mounts}))
    with pytest.raises(StageError, match="mounts"):
        missing_mountpoints(bundle)


def test_formats_do_not_replace_each_other_under_one_name(tree: Path, tmp_path: Path) -> None:
    require_binary("mksquashfs")
    require_binary("unsquashfs")
    from ocistage.errors import OcistageError

    cache = tmp_path / "cache"
    staged = stage_directory(tree, tmp_path / "t", cache_root=cache, name="one")
    with pytest.raises(OcistageError, match="directory bundle"):
        stage_directory(tree, tmp_path / "t", cache_root=cache, name="one", format="squashfs",
                        squashfs_mount=False)
    image = stage_directory(tree, tmp_path / "t", cache_root=cache, name="two",
                            format="squashfs", squashfs_mount=False)
    with pytest.raises(OcistageError, match="squashfs image"):
        stage_directory(tree, tmp_path / "t", cache_root=cache, name="two")
    assert unstage(staged.path, cache_root=cache) and unstage(image.path, cache_root=cache)


def test_building_an_image_reports_mksquashfs_progress(tmp_path: Path) -> None:
    require_binary("mksquashfs")
    from ocistage.stagers.squashfs import build_image

    source = tmp_path / "src"
    source.mkdir()
    for n in range(50):
        (source / f"f{n}").write_bytes(os.urandom(1000 + n))
    seen: list[tuple[int, int]] = []
    build_image(source, tmp_path / "img.sqfs", progress=lambda done, total: seen.append(
        (done, total)))
    assert seen, "mksquashfs's progress bar was not read"
    assert seen[-1][0] == seen[-1][1] >= 50
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(seen))
    assert (tmp_path / "img.sqfs").stat().st_size > 0


def _hostile_image(tmp_path: Path) -> Path:
    """A squashfs image whose pseudo files are what an attacker would ship: device nodes, a
    setuid-root and a setgid-root program (mksquashfs -p, so no root is needed to build it)."""
    require_binary("mksquashfs")
    src = tmp_path / "hostile-src"
    (src / "rootfs" / "bin").mkdir(parents=True)
    (src / "rootfs" / "bin" / "tool").write_text("plain\n")
    (src / "config.json").write_text('{"root": {"path": "rootfs"}}\n')
    image = tmp_path / "hostile.sqfs"
    subprocess.run(
        ["mksquashfs", str(src), str(image), "-noappend", "-quiet", "-no-progress",
         "-p", "rootfs/dev d 755 0 0", "-p", "rootfs/dev/mem c 666 0 0 1 1",
         "-p", "rootfs/dev/sda b 666 0 0 8 0", "-p", "rootfs/bin/su f 4755 0 0 echo root",
         "-p", "rootfs/bin/sg f 2755 0 0 echo group", "-p", "\"rootfs/odd name\" c 600 0 0 1 3"],
        check=True, capture_output=True)
    return image


def _special_files(root: Path) -> list[str]:
    found = []
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            mode = os.lstat(os.path.join(directory, name)).st_mode
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or mode & (stat.S_ISUID | stat.S_ISGID):
                found.append(os.path.relpath(os.path.join(directory, name), root))
    return sorted(found)


def test_images_are_built_with_the_measured_block_size_and_compressor(tmp_path: Path) -> None:
    # docs/squashfs-parameters.md: zstd level 3 and 128 KiB blocks, set explicitly rather than
    # left to mksquashfs's defaults (level 15, and a block size a release may change)
    require_binary("mksquashfs")
    require_binary("unsquashfs")
    from ocistage.stagers.squashfs import build_image

    source = tmp_path / "src"
    source.mkdir()
    (source / "f").write_bytes(b"x" * 300_000)
    build_image(source, tmp_path / "img.sqfs")
    said = subprocess.run(["unsquashfs", "-s", str(tmp_path / "img.sqfs")], check=True,
                          capture_output=True, text=True).stdout
    assert "Compression zstd" in said
    assert "compression-level 3" in said
    assert "Block size 131072" in said


def test_a_hostile_image_unpacks_without_devices_or_setuid(tmp_path: Path) -> None:
    """13.3: `stage URL.sqfs --unpack` ran unsquashfs as is: as root it made device nodes and
    setuid-root files from the image."""
    require_binary("unsquashfs")
    from ocistage.stagers.remote import stage_from_url

    image = _hostile_image(tmp_path)
    cache = tmp_path / "cache"
    staged = stage_from_url(f"file://{image}", tmp_path / "t", cache_root=cache,
                            holder=Holder.pin("test"), mount_image=False)
    assert staged.method == "squashfs-unpack"
    assert _special_files(staged.path) == []
    assert (staged.path / "rootfs" / "bin" / "tool").read_text() == "plain\n"
    su = staged.path / "rootfs" / "bin" / "su"
    assert su.read_text() == "root\n" and stat.S_IMODE(su.stat().st_mode) == 0o755
    assert unstage(staged.path, cache_root=cache)


def test_unpacking_everything_is_for_root_who_asks(tmp_path: Path) -> None:
    require_binary("unsquashfs")
    require_root()  # only root may unpack device nodes
    from ocistage.stagers.squashfs import unpack

    image = _hostile_image(tmp_path)
    (tmp_path / "private").mkdir(mode=0o700)
    unpack(image, tmp_path / "private" / "as-is", rootless=False)
    assert _special_files(tmp_path / "private" / "as-is") == [
        "rootfs/bin/sg", "rootfs/bin/su", "rootfs/dev/mem", "rootfs/dev/sda", "rootfs/odd name"]
    unpack(image, tmp_path / "private" / "rootless")
    assert _special_files(tmp_path / "private" / "rootless") == []


def test_a_user_unpacks_an_image_with_device_nodes(tmp_path: Path) -> None:
    """unsquashfs run by a user failed on the device nodes it may not create; they are left
    out now, so the image unpacks (as a second user, setpriv)."""
    require_binary("unsquashfs")
    require_root()  # needs root and setpriv to run as a second user
    require_python_for(65534, "xxhash, ocistage.stagers.squashfs")
    image = _hostile_image(tmp_path)
    work = Path(tempfile.mkdtemp(prefix="ocistage-user-unpack-"))
    try:
        shutil.copy(image, work / "image.sqfs")
        (work / "private").mkdir(mode=0o700)
        for path in (work, work / "image.sqfs", work / "private"):
            os.chown(path, 65534, 65534)
        script = ("import sys; from pathlib import Path; "
                  "from ocistage.stagers.squashfs import unpack; "
                  "unpack(Path(sys.argv[1]), Path(sys.argv[2]))")
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
             "-c", script, str(work / "image.sqfs"), str(work / "private" / "out")],
            capture_output=True, text=True, cwd=REPO, check=False)
        assert result.returncode == 0, result.stderr
        assert _special_files(work / "private" / "out") == []
        assert (work / "private" / "out" / "rootfs" / "bin" / "tool").read_text() == "plain\n"
    finally:
        shutil.rmtree(work)


def _bomb_image(tmp_path: Path, kind: str) -> Path:
    """A small squashfs image that unpacks to much more: a zero-filled file (``data``:
    squashfs stores it as a sparse run) or 20 000 empty files (``entries``)."""
    require_binary("mksquashfs")
    src = tmp_path / f"{kind}-src"
    src.mkdir()
    if kind == "data":
        with open(src / "zeros", "wb") as sparse:
            sparse.truncate(64 << 20)
    else:
        for n in range(20_000):
            (src / f"e{n}").touch()
    image = tmp_path / f"{kind}.sqfs"
    subprocess.run(["mksquashfs", str(src), str(image), "-noappend", "-quiet", "-no-progress"],
                   check=True, capture_output=True)
    return image


@pytest.mark.parametrize("kind", ["data", "entries"])
def test_a_squashfs_bomb_is_refused_before_anything_is_written(tmp_path: Path,
                                                               kind: str) -> None:
    require_binary("unsquashfs")
    from ocistage.errors import LayerError
    from ocistage.stagers.squashfs import unpack

    image = _bomb_image(tmp_path, kind)
    assert image.stat().st_size < 1 << 20
    (tmp_path / "private").mkdir(mode=0o700)
    with pytest.raises(LayerError, match="unpack limit"):
        unpack(image, tmp_path / "private" / "out", limit=10 << 20)
    assert not (tmp_path / "private" / "out").exists()
    unpack(image, tmp_path / "private" / "fits")  # the default: 4 GiB at least
    assert sum(1 for _ in (tmp_path / "private" / "fits").iterdir()) == (
        1 if kind == "data" else 20_000)
