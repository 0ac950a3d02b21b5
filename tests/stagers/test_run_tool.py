"""The one way mksquashfs and unsquashfs are run (ocistage.stagers.mksquashfs.run_tool): their
failure as a ToolFailed with their last line, a time limit that kills, the progress bar."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ocistage.stagers.errors import ToolFailed
from ocistage.stagers.mksquashfs import run_tool
from pytest_ocistage.components import require_binary, require_root


def test_a_failing_tool_is_its_last_line_and_status() -> None:
    with pytest.raises(ToolFailed) as caught:
        run_tool(["/bin/sh", "-c", "echo first; echo 'FATAL ERROR: no space' >&2; exit 3"],
                 "mksquashfs of x")
    assert caught.value.message == "mksquashfs of x failed: FATAL ERROR: no space"
    # two pipes: the order between them is the order of reading
    assert caught.value.status == 3
    assert sorted(caught.value.said) == ["FATAL ERROR: no space", "first"]


def test_the_error_is_its_stderr_not_what_its_stdout_prints_after() -> None:
    """mksquashfs writes errors to stderr at once and the rest to a buffered stdout, flushed
    at exit: appending to an image, a dozen lines about the image came after 'FATAL ERROR'
    (the endurance test's 'adding ocistage files ... failed: Skipping saving recovery
    file.'), and pushed the error out of the lines kept."""
    script = ("echo 'Write failed because No space left on device' >&2; "
              "echo 'FATAL ERROR: Failed to write to output filesystem' >&2; "
              "echo 'Exiting - restoring original filesystem!' >&2; "
              "for n in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do echo \"line $n\"; done; "
              "echo 'Skipping saving recovery file.'; exit 1")
    with pytest.raises(ToolFailed) as caught:
        run_tool(["/bin/sh", "-c", script], "adding ocistage files to x.sqfs")
    assert caught.value.message == ("adding ocistage files to x.sqfs failed: no space left on "
                                    "its filesystem (FATAL ERROR: Failed to write to output "
                                    "filesystem)")
    assert caught.value.no_space and caught.value.status == 1
    assert caught.value.detail == "FATAL ERROR: Failed to write to output filesystem"


def test_without_a_fatal_line_the_error_is_its_last_stderr_line() -> None:
    with pytest.raises(ToolFailed) as caught:
        run_tool(["/bin/sh", "-c", "echo 'cannot open x' >&2; echo done; exit 2"], "unsquashfs")
    assert caught.value.message == "unsquashfs failed: cannot open x"


def test_a_tool_that_cannot_be_started() -> None:
    with pytest.raises(ToolFailed) as caught:
        run_tool(["/nonexistent/mksquashfs"], "mksquashfs of x")
    assert caught.value.status == 127 or caught.value.status is None


def test_a_tool_past_its_time_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(ToolFailed, match="still running after"):
        run_tool(["/bin/sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], "unsquashfs",
                 timeout=1)
    assert time.monotonic() - started < 30
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_mksquashfs_progress_is_reported(tmp_path: Path) -> None:
    """The bar mksquashfs draws is reported to its end. A build of a few dozen files may end
    before mksquashfs 4.5 draws any bar at all (it printed only a newline in 2 of 300 builds
    of 50 files on a loaded host; CI failed once so): 2000 files drew it in 150 of 150."""
    mksquashfs = require_binary("mksquashfs", "squashfs-tools")
    tree = tmp_path / "tree"
    tree.mkdir()
    for n in range(2000):
        (tree / f"f{n}").write_bytes(os.urandom(1000))
    seen: list[tuple[int, int]] = []
    run_tool([mksquashfs, str(tree), str(tmp_path / "img"), "-noappend", "-quiet",
              "-processors", "1"], "mksquashfs", progress=lambda done, all: seen.append(
                  (done, all)))
    assert seen and seen[-1][0] == seen[-1][1] > 0


def test_mksquashfs_out_of_space_says_so(tmp_path: Path) -> None:
    """mksquashfs 4.5 says only 'FATAL ERROR: Failed to write to output filesystem' when the
    filesystem it writes to is full (seen in the endurance test): the error says no space."""
    require_root()  # mounting a small tmpfs needs root
    from tests.cache.test_full_filesystem import fill
    from tests.soak import tmpfs

    mksquashfs = require_binary("mksquashfs", "squashfs-tools")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "data").write_bytes(os.urandom(2 << 20))
    with tmpfs(tmp_path / "fs", "4m") as small:
        fill(small)
        with pytest.raises(ToolFailed) as caught:
            run_tool([mksquashfs, str(tree), str(small / "img"), "-noappend", "-quiet",
                      "-no-progress", "-processors", "1"], "mksquashfs of tree",
                     output=small / "img")
    assert caught.value.no_space and "no space left on the filesystem of" in caught.value.message


def test_mksquashfs_appending_out_of_space_says_so(tmp_path: Path) -> None:
    """Appending (``stage --format squashfs`` adds its own files to the image in a second
    run) onto a full filesystem: mksquashfs prints its error, then, at exit, a dozen lines
    about the image and 'Skipping saving recovery file.'; the error says no space."""
    require_root()  # mounting a small tmpfs needs root
    from tests.cache.test_full_filesystem import fill
    from tests.soak import tmpfs

    mksquashfs = require_binary("mksquashfs", "squashfs-tools")
    tree, extra = tmp_path / "tree", tmp_path / "extra"
    tree.mkdir()
    extra.mkdir()
    (tree / "data").write_bytes(os.urandom(64 << 10))
    (extra / "more").write_bytes(os.urandom(2 << 20))
    with tmpfs(tmp_path / "fs", "4m") as small:
        image = small / "img"
        run_tool([mksquashfs, str(tree), str(image), "-noappend", "-quiet", "-no-progress",
                  "-no-recovery", "-processors", "1"], "mksquashfs of tree", output=image)
        fill(small)
        with pytest.raises(ToolFailed) as caught:
            run_tool([mksquashfs, str(extra), str(image), "-no-progress", "-quiet",
                      "-no-recovery"], "adding ocistage files to img", output=image)
    assert caught.value.no_space, caught.value.message
    assert "no space left on the filesystem of" in caught.value.message
    assert "FATAL ERROR" in caught.value.message
