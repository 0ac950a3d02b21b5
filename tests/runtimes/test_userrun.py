"""ocistage.runtimes.userrun: what a user other than root needs to run a bundle here, said when
the bundle is made (issue 28, item 2). tests/e2e/test_bundle_user_runc.py runs real runc as
nobody."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ocistage.cache.notice import Kind
from ocistage.runtimes.userrun import runc_version, user_run_command, user_run_notices

BUNDLE = Path("/scratch/my bundle")


def config(process_uid: int, user_namespace: bool = True) -> dict[str, Any]:
    namespaces = [{"type": "pid"}, *([{"type": "user"}] if user_namespace else [])]
    return {"process": {"user": {"uid": process_uid, "gid": process_uid}},
            "linux": {"namespaces": namespaces}}


def fake_runc(tmp_path: Path, output: str, status: int = 0) -> str:
    script = tmp_path / "runc"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' '{output}'\nexit {status}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(("output", "status", "expected"), [
    ("runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev", 0, (1, 1, 5)),
    ("runc version 1.2.0-rc.1\nspec: 1.2.0", 0, (1, 2, 0)),
    ("runc version 1.3\n", 0, (1, 3)),
    ("something else", 0, None),
    ("runc version 1.1.5", 1, None),
])
def test_runc_version_is_read_from_its_first_line(tmp_path: Path, output: str, status: int,
                                                  expected: tuple[int, ...] | None) -> None:
    assert runc_version(fake_runc(tmp_path, output, status)) == expected


def test_no_runc_no_version(tmp_path: Path) -> None:
    assert runc_version(str(tmp_path / "missing")) is None


def notices(cfg: dict[str, Any], *, uid: int = 1000, runtime_dir: str | None = None,
            runc: tuple[int, ...] | None = (1, 1, 5)) -> list[str]:
    asked: list[bool] = []

    def find_runc() -> tuple[int, ...] | None:
        asked.append(True)
        return runc

    environ = {} if runtime_dir is None else {"XDG_RUNTIME_DIR": runtime_dir}
    found = user_run_notices(cfg, BUNDLE, uid=uid, environ=environ, find_runc=find_runc)
    assert {notice.kind for notice in found} <= {Kind.RUNTIME}
    if cfg["process"]["user"]["uid"] == 0:
        assert not asked  # runc is asked only when its limit matters
    return [notice.text for notice in found]


def test_a_user_bundling_an_image_user_under_runc_1_1_is_told_the_fix(tmp_path: Path) -> None:
    [text] = notices(config(1000), runtime_dir=str(tmp_path))
    assert text.startswith("runc 1.1.5 (on PATH) cannot run this bundle as you")
    assert "uid 1000" in text and "--map-root" in text and "crun" in text


@pytest.mark.parametrize("runc", [(1, 2, 0), (1, 2), (2, 0), None])
def test_a_runc_that_runs_it_or_none_says_nothing(tmp_path: Path,
                                                  runc: tuple[int, ...] | None) -> None:
    assert notices(config(1000), runtime_dir=str(tmp_path), runc=runc) == []


def test_root_in_the_container_or_no_user_namespace_or_root_outside(tmp_path: Path) -> None:
    assert notices(config(0), runtime_dir=str(tmp_path)) == []  # --map-root, a root image
    assert notices(config(1000, user_namespace=False)) == []    # --no-rootless
    assert notices(config(1000), uid=0) == []                    # root may map any id


@pytest.mark.parametrize("runtime_dir", [None, "", "/nonexistent/run", "file"])
def test_no_usable_runtime_dir_is_told_the_command_line(tmp_path: Path,
                                                         runtime_dir: str | None) -> None:
    if runtime_dir == "file":
        runtime_dir = str(tmp_path / "file")
        Path(runtime_dir).write_text("")
    [text] = notices(config(0), runtime_dir=runtime_dir)
    assert text.startswith("XDG_RUNTIME_DIR is not set" if not runtime_dir
                           else f"XDG_RUNTIME_DIR ({runtime_dir}) is not a directory")
    assert text.endswith("--root: " + user_run_command(BUNDLE))


def test_an_unwritable_runtime_dir_counts_as_none(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes any directory")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert len(notices(config(0), runtime_dir=str(locked))) == 1


def test_the_command_line_quotes_the_bundle_and_keeps_home_for_the_shell() -> None:
    assert user_run_command(BUNDLE) == \
        "runc --root \"$HOME/.local/state/runc\" run -b '/scratch/my bundle' NAME"
    assert user_run_command(BUNDLE, "crun").startswith('crun --root "$HOME/.local/state/crun"')


def test_submit_is_told_what_bundle_is_told_about_runc_1_1() -> None:
    """Issue 34 item 5: `submit` made jobs that failed under runc 1.1 for an image user other
    than root, silently, where `bundle` warned; one check serves both, with the option of the
    command that was run. What runc needs from this shell (XDG_RUNTIME_DIR) is not asked:
    oci.conf gives runc its --root on the nodes."""
    from ocistage.runtimes.userrun import slurm_run_notices

    [notice] = slurm_run_notices(config(1000), uid=1000, find_runc=lambda: (1, 1, 5))
    assert notice.kind is Kind.RUNTIME and "submit with --map-root" in notice.text
    assert "make the bundle" not in notice.text
    assert slurm_run_notices(config(0), uid=1000, find_runc=lambda: (1, 1, 5)) == ()
    assert slurm_run_notices(config(1000), uid=0, find_runc=lambda: (1, 1, 5)) == ()
    assert slurm_run_notices(config(1000), uid=1000, find_runc=lambda: (1, 2, 0)) == ()
    assert slurm_run_notices(config(1000, user_namespace=False), uid=1000,
                             find_runc=lambda: (1, 1, 5)) == ()
