"""``stage --format squashfs --mount`` mounts with squashfuse_ll where it is installed (faster:
docs/performance.md), with squashfuse where it is not or where squashfuse_ll fails."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.stagers.squashfs import mount
from tests.stagers.conftest import require_fuse_mount

REAL = {name: shutil.which(name) for name in ("squashfuse_ll", "squashfuse", "mksquashfs")}


@pytest.fixture
def image(tmp_path: Path) -> Path:
    require_fuse_mount("squashfuse_ll")
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "hello").write_text("hello\n")
    built = tmp_path / "image.sqfs"
    subprocess.run([str(REAL["mksquashfs"]), str(tree), str(built), "-quiet", "-no-progress"],
                   check=True, capture_output=True)
    return built


def fstype(mountpoint: Path) -> str | None:
    """The filesystem type mounted at ``mountpoint`` (from /proc/self/mountinfo)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        if fields[4] == os.fspath(mountpoint):
            return fields[separator + 1]
    return None


@pytest.fixture
def mountpoint(tmp_path: Path) -> Iterator[Path]:
    point = tmp_path / "mnt"
    point.mkdir()
    yield point
    if os.path.ismount(point):
        tool = shutil.which("fusermount3") or shutil.which("fusermount") or "umount"
        subprocess.run([tool, "-u", str(point)] if "fusermount" in tool else [tool, str(point)],
                       check=False, capture_output=True)


def path_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **tools: str) -> Path:
    """PATH = one directory holding ``tools`` (name -> script text, or "real": a link to the
    installed one) and links to fusermount, nothing else."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in tools.items():
        if text == "real":
            os.symlink(str(REAL[name]), bin_dir / name)
        else:
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
    for name in ("fusermount3", "fusermount"):   # linked: their directory holds squashfuse
        real = shutil.which(name)
        if real is not None:
            os.symlink(real, bin_dir / name)
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


def test_squashfuse_ll_is_used_where_installed(image: Path, mountpoint: Path) -> None:
    assert mount(image, mountpoint)
    assert fstype(mountpoint) == "fuse.squashfuse_ll"
    assert (mountpoint / "etc" / "hello").read_text() == "hello\n"


def test_squashfuse_without_squashfuse_ll(image: Path, mountpoint: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path_with(tmp_path, monkeypatch, squashfuse="real")
    assert mount(image, mountpoint)
    assert fstype(mountpoint) == "fuse.squashfuse"
    assert (mountpoint / "etc" / "hello").read_text() == "hello\n"


def test_squashfuse_when_squashfuse_ll_fails(image: Path, mountpoint: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "tried"
    path_with(tmp_path, monkeypatch, squashfuse="real",
              squashfuse_ll=f'#!/bin/sh\necho "$@" >> {log}\nexit 1\n')
    assert mount(image, mountpoint)
    assert fstype(mountpoint) == "fuse.squashfuse"
    assert len(log.read_text().splitlines()) == 2  # with allow_other, then without


@pytest.mark.parametrize("tool", ["squashfuse_ll", "squashfuse"])
def test_the_mount_is_read_only(tool: str, image: Path, mountpoint: Path, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The image cannot change, and the mount says so: on a FUSE mount that is not read-only
    every read makes the kernel forget the file's access time, so the next stat of the file
    (tar's, after reading it) is one more request to the server per file (docs/performance.md,
    G8)."""
    path_with(tmp_path, monkeypatch, **{tool: "real"})
    assert mount(image, mountpoint)
    assert fstype(mountpoint) == f"fuse.{tool}"
    assert os.statvfs(mountpoint).f_flag & os.ST_RDONLY
    assert (mountpoint / "etc" / "hello").read_text() == "hello\n"
    with pytest.raises(OSError):
        (mountpoint / "etc" / "new").write_text("x")


def test_neither_installed_means_no_mount(image: Path, mountpoint: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path_with(tmp_path, monkeypatch)
    assert not mount(image, mountpoint)
    assert not os.path.ismount(mountpoint)
