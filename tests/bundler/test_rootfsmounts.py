"""ocistage.stagers.mountrule and ocistage.bundler.rootfsmounts: which mounts get a mount point
in the rootfs, that it is made without following the image's symlinks, and with times that keep
bundles of one image equal."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ocistage.bundler.rootfsmounts import MOUNT_POINT_TIME_NS, make_mount_points
from ocistage.bundler.runtime_config import ConfigOptions, build_runtime_config
from ocistage.stagers.mountrule import MountPoint, mount_points

OLD = 1_600_000_000_000_000_000
ROOT_TIMES = (OLD + 7, OLD + 11)


def default_mounts(rootfs: Path, *binds: str) -> list[dict[str, Any]]:
    options = ConfigOptions(args=["/bin/sh"], mounts=list(binds))
    mounts = build_runtime_config({"config": {}}, rootfs, options)["mounts"]
    assert isinstance(mounts, list)
    return mounts


def scratch_rootfs(tmp_path: Path) -> Path:
    """A ``FROM scratch`` tree: a binary and nothing of /proc, /dev or /sys."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "bin" / "tool").write_text("#!/bin/sh\n")
    os.utime(rootfs, ns=ROOT_TIMES)
    return rootfs


def times(path: Path) -> tuple[int, int]:
    info = path.lstat()
    return info.st_atime_ns, info.st_mtime_ns


def test_filesystems_and_the_sysfs_bind_get_one_nested_mounts_do_not(tmp_path: Path) -> None:
    # /dev/pts, /dev/shm and /dev/mqueue are made by the runtime inside /dev's tmpfs
    assert mount_points(default_mounts(tmp_path)) == [
        MountPoint(("proc",), "d"), MountPoint(("dev",), "d"), MountPoint(("sys",), "d")]


def test_a_bind_gets_the_kind_of_its_source_and_none_for_a_source_missing_here(
        tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    mounts = default_mounts(tmp_path, f"{tmp_path}/dir:/data/in", f"{tmp_path}/file:/etc/f",
                            f"{tmp_path}/missing:/gone", f"{tmp_path}/dir:/dev/extra",
                            f"{tmp_path}/dir:/data/in/deeper", f"{tmp_path}/dir:/./data//in2")
    mounts.append({"destination": "/a/../b", "type": "tmpfs", "source": "tmpfs"})
    mounts.append({"destination": "/", "type": "tmpfs", "source": "tmpfs"})
    mounts.append({"destination": "/proc", "type": "tmpfs", "source": "tmpfs"})
    assert mount_points(mounts)[3:] == [
        MountPoint(("data", "in"), "d"), MountPoint(("etc", "f"), "f"),
        MountPoint(("gone",), None), MountPoint(("data", "in2"), "d")]


def test_a_mount_below_a_later_one_still_gets_its_own(tmp_path: Path) -> None:
    """runtimes mount in order: /data/in is made in the rootfs before /data covers it."""
    mounts = [{"destination": "/data/in", "type": "tmpfs", "source": "tmpfs"},
              {"destination": "/data", "type": "tmpfs", "source": "tmpfs"}]
    assert [m.parts for m in mount_points(mounts)] == [("data", "in"), ("data",)]


def test_missing_mount_points_get_a_fixed_time_their_parent_keeps_its_own(tmp_path: Path) -> None:
    rootfs = scratch_rootfs(tmp_path)
    (tmp_path / "host").mkdir()
    (tmp_path / "hosts").write_text("127.0.0.1 localhost\n")
    made = make_mount_points(rootfs, default_mounts(tmp_path, f"{tmp_path}/host:/srv/a/b",
                                                    f"{tmp_path}/hosts:/etc/hosts",
                                                    f"{tmp_path}/missing:/gone"))
    assert made == ["/proc", "/dev", "/sys", "/srv", "/srv/a", "/srv/a/b", "/etc",
                    "/etc/hosts"]
    umask = os.umask(0)
    os.umask(umask)
    for name in made:
        path = rootfs / name.lstrip("/")
        assert not path.is_symlink()
        assert path.is_dir() == (name != "/etc/hosts")
        assert path.stat().st_mode & 0o7777 == (0o644 if name == "/etc/hosts" else 0o755) & ~umask
        assert times(path) == (MOUNT_POINT_TIME_NS, MOUNT_POINT_TIME_NS), name
    assert (rootfs / "etc/hosts").read_bytes() == b""
    assert not (rootfs / "gone").exists()
    assert times(rootfs) == ROOT_TIMES  # the rootfs' own times are restored
    assert sorted(os.listdir(rootfs / "dev")) == []  # /dev/pts is the runtime's, in its tmpfs


def test_what_the_image_has_at_a_mount_point_is_left_as_it_is(tmp_path: Path) -> None:
    rootfs = scratch_rootfs(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.utime(outside, ns=ROOT_TIMES)
    (rootfs / "proc").symlink_to(outside)  # an absolute host path: inside, it is /…/outside
    (rootfs / "dev").write_text("not a directory\n")
    (rootfs / "sys").mkdir()
    os.utime(rootfs / "sys", ns=(OLD, OLD))
    (rootfs / "mnt").symlink_to("/")  # a bind below a symlink: resolved by the runtime only
    (rootfs / "etc").write_text("a file where a directory would be\n")
    os.utime(rootfs, ns=ROOT_TIMES)
    made = make_mount_points(rootfs, default_mounts(tmp_path, f"{outside}:/mnt/x",
                                                    f"{outside}:/etc/data"))
    assert made == []
    assert os.readlink(rootfs / "proc") == str(outside)
    assert (rootfs / "dev").read_text() == "not a directory\n"
    assert times(rootfs / "sys") == (OLD, OLD)
    assert times(outside)[1] == ROOT_TIMES[1] and os.listdir(outside) == []
    assert not (rootfs / "x").exists() and not (tmp_path / "x").exists()
    assert times(rootfs) == ROOT_TIMES


def test_an_image_with_every_mount_point_is_not_touched(tmp_path: Path) -> None:
    rootfs = scratch_rootfs(tmp_path)
    for name in ("proc", "dev", "sys"):
        (rootfs / name).mkdir()
        os.utime(rootfs / name, ns=(OLD, OLD))
    os.utime(rootfs, ns=ROOT_TIMES)
    assert make_mount_points(rootfs, default_mounts(tmp_path)) == []
    assert times(rootfs) == ROOT_TIMES
    assert all(times(rootfs / name) == (OLD, OLD) for name in ("proc", "dev", "sys"))


def test_a_mount_point_below_a_symlinked_parent_is_not_made_through_it(tmp_path: Path) -> None:
    rootfs = scratch_rootfs(tmp_path)
    (tmp_path / "host").mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (rootfs / "srv").symlink_to(target)
    (rootfs / "opt").mkdir()
    (rootfs / "opt" / "deep").symlink_to(target)
    made = make_mount_points(rootfs, default_mounts(tmp_path, f"{tmp_path}/host:/srv/data",
                                                    f"{tmp_path}/host:/opt/deep/er/data"))
    assert made == ["/proc", "/dev", "/sys"]
    assert os.listdir(target) == []
