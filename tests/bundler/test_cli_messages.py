"""What a new user reads: errors name what the user gave (DEST, the stage target), not a scratch
dir or the cache; warnings for what would fail later; counts in English."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from ocistage.cache.errors import StoreError
from ocistage.cache.sizes import count
from pytest_ocistage.components import require_binary
from tests.bundler.clirun import Cli, cli
from tests.bundler.tarbuilder import build_tar, directory, file, write_oci_layout
from tests.stagers.conftest import make_tree

__all__ = ["cli"]  # the fixture


@pytest.fixture
def ref(tmp_path: Path) -> str:
    layout = tmp_path / "image"
    write_oci_layout(layout, [build_tar([directory("bin"), file("hello.txt", b"hello")])],
                     tag="v1", container={"Cmd": ["/bin/sh"]})
    return f"oci:{layout}:v1"


def _error_and_hint(stderr: str) -> tuple[str, str]:
    lines = [line for line in stderr.splitlines() if line.startswith(("error: ", "hint: "))]
    assert len(lines) == 2, stderr
    return lines[0], lines[1]


def test_counts_are_singular_and_plural() -> None:
    assert [count(n, "blob") for n in (0, 1, 2)] == ["0 blobs", "1 blob", "2 blobs"]
    assert [count(n, "entry", "entries") for n in (1, 3)] == ["1 entry", "3 entries"]


def test_pull_and_bundle_say_1_layer(cli: Cli, ref: str) -> None:
    pulled = cli("pull", ref)
    assert "(linux/amd64, 1 layer, " in pulled.stderr and "reused 0 blobs)" in pulled.stderr
    again = cli("pull", ref)
    assert "reused 2 blobs)" in again.stderr, again.stderr  # config and layer
    made = cli("bundle", ref, str(cli.root / "b"))
    assert made.stderr.startswith(f"made bundle of {ref} (linux/amd64, 1 layer)")


def test_a_dest_whose_parent_cannot_be_made_is_named(cli: Cli, ref: str) -> None:
    (cli.root / "afile").write_bytes(b"")
    dest = cli.root / "afile" / "sub" / "b"
    outcome = cli("bundle", ref, str(dest))
    assert outcome.exit_code == 1
    error, hint = _error_and_hint(outcome.stderr)
    assert error.startswith(f"error: cannot create {dest}: Not a directory")
    assert "parent directories are created" in hint


def test_a_dest_that_cannot_be_written_is_named_not_its_scratch_dir(
        cli: Cli, ref: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ocistage.bundler.flows import bundle

    monkeypatch.setattr(bundle, "scratch_name", lambda name: f"no-such-dir/.{name}.scratch")
    dest = cli.root / "deep" / "b"
    outcome = cli("bundle", ref, str(dest))
    error, hint = _error_and_hint(outcome.stderr)
    assert error == f"error: cannot create {dest}: No such file or directory"
    assert hint == f"hint: check that you may write in {dest.parent}"
    assert (cli.root / "deep").is_dir()  # the missing parent was made, as --help says


def test_a_target_that_cannot_be_written_is_blamed_not_the_cache(
        cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from ocistage.cache.locks import FileLock

    target = cli.root / "target"
    acquire = FileLock.acquire

    def refused(self: FileLock, *args: object, **kwargs: object) -> object:
        if target in self.path.parents:
            raise StoreError(f"cannot create lock file {self.path}: Permission denied")
        return acquire(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FileLock, "acquire", refused)
    outcome = cli("stage", str(make_tree(cli.root / "tree")), "--to", str(target))
    assert outcome.exit_code == 1
    error, hint = _error_and_hint(outcome.stderr)
    assert error.startswith("error: cannot create lock file")
    assert hint.startswith(f"hint: you cannot write in the stage target {target}")
    assert "cache" not in hint


def test_staging_errors_of_permission_blame_the_target(tmp_path: Path) -> None:
    from ocistage.stagers.transaction import staging_error

    error = staging_error(PermissionError(13, "Permission denied", str(tmp_path / "t")),
                          "cannot create the target", tmp_path)
    assert f"you cannot write in the stage target {tmp_path}" in str(error.hint)


def test_gpus_without_the_hook_here_warn(cli: Cli, ref: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from ocistage.bundler import runtime_config

    monkeypatch.setenv("PATH", str(cli.root))
    monkeypatch.setattr(runtime_config, "NVIDIA_HOOK_DEFAULT_PATH", str(cli.root / "hook"))
    outcome = cli("bundle", "--gpus", "all", ref, str(cli.root / "b"))
    assert outcome.exit_code == 0, outcome.stderr
    assert "warning: nvidia-container-runtime-hook is not installed on this host" \
        in outcome.stderr
    assert cli("bundle", "--gpus", "banana", ref, str(cli.root / "c")).exit_code == 2


def test_a_squashfs_image_built_without_a_terminal_says_when_it_starts_and_ends(
        cli: Cli) -> None:
    require_binary("mksquashfs")
    require_binary("unsquashfs")
    tree = str(make_tree(cli.root / "tree"))
    target = str(cli.root / "target")
    outcome = cli("stage", tree, "--to", target, "--format", "squashfs", "--unpack")
    assert outcome.exit_code == 0, outcome.stderr
    lines = outcome.stderr.splitlines()
    assert lines[0] == "building the squashfs image (mksquashfs) ..."
    assert re.fullmatch(r"built the squashfs image: \d+ files in \d+\.\d s", lines[1]), lines
    quiet = cli("stage", "-q", tree, "--to", target, "--format", "squashfs", "--unpack",
                "--name", "again")
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_the_build_lines_time_what_mksquashfs_took() -> None:
    from ocistage.bundler.cli import stage as cli_stage

    times = iter([10.0, 36.25])
    said: list[str] = []
    with contextlib.redirect_stderr(io.StringIO()) as err:
        with cli_stage._image_log_lines(lambda: next(times)) as update:
            update(0, 0)
            update(500, 1000)
            update(1000, 1000)
            update(1000, 1000)
        said = err.getvalue().splitlines()
    assert said == ["building the squashfs image (mksquashfs) ...",
                    "built the squashfs image: 1000 files in 26.2 s"]
    with contextlib.redirect_stderr(io.StringIO()) as err, \
            cli_stage._image_log_lines(lambda: 0.0):
        pass
    assert err.getvalue() == ""  # no image was built
