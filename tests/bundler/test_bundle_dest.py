"""The DEST of ``ocistage bundle``: a symbolic link, and several commands racing for one DEST.

The race runs the real CLI in parallel processes, several rounds, and checks what a user sees:
one winner with a complete bundle, the others one ``error:`` line each, never a traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ocistage.bundler.flows.bundle import make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.cache.store import Store
from ocistage.errors import UsageError
from tests.bundler.tarbuilder import build_tar, directory, file, write_oci_layout

LAYER = build_tar([directory("bin"), file("bin/tool", b"#!/bin/sh\n" * 1000, mode=0o755),
                   *(file(f"data/f{n}", b"x" * n) for n in range(200))])


def _layout(tmp_path: Path) -> str:
    write_oci_layout(tmp_path / "layout", [LAYER], tag="t", kind="gzip")
    return f"oci:{tmp_path / 'layout'}:t"


@pytest.mark.parametrize("target", ["empty-dir", "dangling", "file"])
def test_a_symlink_dest_is_refused(tmp_path: Path, target: str) -> None:
    ref = _layout(tmp_path)
    pointed = tmp_path / "pointed"
    if target == "empty-dir":
        pointed.mkdir()
    elif target == "file":
        pointed.write_text("x")
    dest = tmp_path / "dest"
    dest.symlink_to(pointed)
    store = Store.open(tmp_path / "cache")
    with pytest.raises(UsageError, match="is a symbolic link"):
        make_bundle(parse_reference(ref), store, dest,
                    config_options=ConfigOptions(args=["/bin/tool"]))
    assert dest.is_symlink() and os.readlink(dest) == str(pointed)
    assert not pointed.exists() or pointed.is_file() or not any(pointed.iterdir())


def _cli() -> list[str]:
    script = shutil.which("ocistage")
    return [script] if script else [sys.executable, "-m", "ocistage"]


@pytest.mark.parametrize("processes", [2, 4])
def test_concurrent_bundles_into_one_dest_have_one_winner(tmp_path: Path,
                                                          processes: int) -> None:
    ref = _layout(tmp_path)
    env = {**os.environ, "OCISTAGE_CACHE": str(tmp_path / "cache"), "NO_COLOR": "1",
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    subprocess.run([*_cli(), "pull", "-q", ref], env=env, check=True, capture_output=True)
    for round_ in range(4):
        dest = tmp_path / f"dest{round_}"
        if round_ % 2:
            dest.mkdir()  # an empty directory made for the bundle
        children = [subprocess.Popen([*_cli(), "bundle", "-q", "--cmd", "/bin/tool", ref,
                                      str(dest)], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
                    for _ in range(processes)]
        results = [(child.wait(timeout=120), *child.communicate()) for child in children]
        winners = [r for r in results if r[0] == 0]
        assert len(winners) == 1, results
        assert winners[0][1].strip() == str(dest)
        for code, _, stderr in results:
            assert "Traceback" not in stderr, stderr
            if code != 0:
                errors = [line for line in stderr.splitlines() if line.startswith("error:")]
                assert len(errors) == 1 and str(dest) in errors[0], stderr
                assert code == 2
        assert (dest / "config.json").is_file()
        assert (dest / "rootfs/bin/tool").read_bytes() == b"#!/bin/sh\n" * 1000
        leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(f".dest{round_}")]
        assert leftovers == []
