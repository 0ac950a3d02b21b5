"""ocistage.runtimes.bundle_command: a command's PATH lookup inside the bundle, never on the
host."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ocistage.runtimes.bundle_command import resolve_command


def _bundle(tmp_path: Path, env: list[str] | None = None, root: str = "rootfs") -> Path:
    bundle = tmp_path / "bundle"
    (bundle / root).mkdir(parents=True)
    process: dict[str, object] = {"args": ["true"], "cwd": "/"}
    if env is not None:
        process["env"] = env
    (bundle / "config.json").write_text(json.dumps({"root": {"path": root},
                                                    "process": process}))
    return bundle


def _executable(path: Path, mode: int = 0o755) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)


def test_the_first_match_on_the_images_path_wins(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, ["PATH=/opt/tools/bin:/bin", "HOME=/"])
    _executable(bundle / "rootfs" / "bin" / "sh")
    assert resolve_command(bundle, ["sh", "-c", "x"]) == ["/bin/sh", "-c", "x"]
    _executable(bundle / "rootfs" / "opt" / "tools" / "bin" / "sh")
    assert resolve_command(bundle, ["sh"]) == ["/opt/tools/bin/sh"]


def test_without_a_path_the_runtimes_default_is_searched(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    _executable(bundle / "rootfs" / "usr" / "bin" / "env")
    assert resolve_command(bundle, ["env"]) == ["/usr/bin/env"]


def test_a_symlink_inside_the_rootfs_is_followed_there(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, ["PATH=/bin"])
    rootfs = bundle / "rootfs"
    _executable(rootfs / "usr" / "bin" / "busybox")
    (rootfs / "bin").symlink_to("/usr/bin")  # absolute: resolved against the rootfs
    (rootfs / "usr" / "bin" / "sh").symlink_to("busybox")
    assert resolve_command(bundle, ["sh"]) == ["/bin/sh"]


def test_nothing_outside_the_rootfs_is_taken_for_the_images(tmp_path: Path) -> None:
    host = tmp_path / "host-bin"
    _executable(host / "tool")
    bundle = _bundle(tmp_path, ["PATH=/bin:/escape"])
    rootfs = bundle / "rootfs"
    (rootfs / "bin").mkdir()
    (rootfs / "bin" / "tool").symlink_to("../../../host-bin/tool")  # .. clamps at the root
    (rootfs / "escape").symlink_to(str(host))  # absolute: means rootfs/<host>, absent
    assert os.path.exists(rootfs / "bin" / "tool")  # on the host it would resolve
    assert resolve_command(bundle, ["tool", "x"]) == ["tool", "x"]


@pytest.mark.parametrize("command", [["/bin/sh"], ["./run.sh"], ["bin/sh"], []])
def test_a_command_with_a_slash_or_none_is_left_alone(tmp_path: Path,
                                                       command: list[str]) -> None:
    bundle = _bundle(tmp_path, ["PATH=/bin"])
    _executable(bundle / "rootfs" / "bin" / "sh")
    assert resolve_command(bundle, command) == command


def test_not_found_or_not_executable_is_left_alone(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, ["PATH=/bin:relative/dir"])
    _executable(bundle / "rootfs" / "bin" / "data", mode=0o644)
    (bundle / "rootfs" / "bin" / "dir").mkdir()
    assert resolve_command(bundle, ["data"]) == ["data"]
    assert resolve_command(bundle, ["dir"]) == ["dir"]
    assert resolve_command(bundle, ["missing"]) == ["missing"]


def test_the_config_root_path_is_used(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, ["PATH=/bin"], root="other-root")
    _executable(bundle / "other-root" / "bin" / "sh")
    assert resolve_command(bundle, ["sh"]) == ["/bin/sh"]
