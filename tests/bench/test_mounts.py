"""``python -m bench mounts`` (bench/mounts.py): the FUSE server it accounts a read to, and its
table; nothing is timed."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.mounts import (
    READERS,
    fuse_server,
    render,
    running,
    sample_name,
    server_usage,
    take_down,
)
from ocistage.stagers.squashfs import mount
from tests.stagers.conftest import require_fuse_mount


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Path]:
    require_fuse_mount("squashfuse_ll")
    tree = tmp_path / "tree"
    tree.mkdir()
    for n in range(20):
        (tree / f"f{n}").write_bytes(b"x" * 1000 * n)
    image = tmp_path / "image.sqfs"
    subprocess.run([str(shutil.which("mksquashfs")), str(tree), str(image), "-quiet",
                    "-no-progress"], check=True, capture_output=True)
    point = tmp_path / "mnt"
    point.mkdir()
    assert mount(image, point)
    yield point
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    subprocess.run([tool, "-u", str(point)] if tool else ["umount", str(point)], check=False,
                   capture_output=True)


def test_the_read_is_accounted_to_the_server_of_that_mount(mounted: Path,
                                                           tmp_path: Path) -> None:
    server = fuse_server(mounted)
    assert server is not None
    assert Path(f"/proc/{server}/comm").read_text().strip() == "squashfuse_ll"
    cpu, waits = server_usage(server)
    for n in range(20):
        assert (mounted / f"f{n}").read_bytes() == b"x" * 1000 * n
    cpu_after, waits_after = server_usage(server)
    # a server that shares the reader's CPU may find the next request queued and not wait
    assert cpu_after >= cpu
    assert waits_after >= waits
    (tmp_path / "other").mkdir()
    assert fuse_server(tmp_path / "other") is None  # not mounted: no server
    assert server_usage(None) == (0.0, 0)


@pytest.mark.needs_root("the bench unmounts with umount, as root")
def test_take_down_returns_once_the_server_is_gone(mounted: Path) -> None:
    """The next read's mount at the same path finds its own server, not this one exiting (a
    read once failed on the vanished /proc entry of the previous read's server)."""
    server = fuse_server(mounted)
    assert server is not None
    assert running(server)
    take_down(mounted, server)
    assert not running(server)
    assert fuse_server(mounted) is None


def test_each_reader_is_compared_with_the_kernel_read_by_the_same_reader() -> None:
    def row(median: float, waits: float) -> dict[str, float]:
        return {"median": median, "min": median, "max": median, "server_cpu": 0.5,
                "server_waits": waits}

    summary = {sample_name("squashfuse_ll", "tar"): row(3.0, 80_000),
               sample_name("kernel", "tar"): row(1.5, 0),
               sample_name("squashfuse_ll", "parallel"): row(1.5, 20_000),
               sample_name("kernel", "parallel"): row(1.5, 0)}
    text = render({"summary": summary, "image": "single", "image_bytes": 88 << 20,
                   "entries": 19534, "load_before": [0.5, 0, 0], "load_after": [0.7, 0, 0]})
    lines = {tuple(line.split()[:2]): line.split() for line in text.splitlines()[1:-1]}
    assert set(READERS) == {"tar", "parallel"}
    assert lines[("squashfuse_ll", "tar")][5] == "2.00x"
    assert lines[("squashfuse_ll", "parallel")][5] == "1.00x"
    assert lines[("squashfuse_ll", "tar")][-1] == "80000"
    assert "load 0.5 -> 0.7" in text
