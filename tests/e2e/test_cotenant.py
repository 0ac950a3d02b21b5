"""A hostile co-tenant (a second uid through ``setpriv``) against what ocistage run as root
writes into or removes from directories others can write (issue 13.1, 13.2)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bundler.tarbuilder import build_tar, file, write_oci_layout
from tests.e2e.conftest import OcistageRunner

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="a co-tenant needs root and setpriv")


def as_nobody(*argv: str) -> None:
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                    *argv], check=True, timeout=60)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A sticky, world-writable directory like /tmp or /scratch (pytest's tmp_path is
    private to its owner)."""
    base = Path(tempfile.mkdtemp(prefix="ocistage-cotenant-"))
    base.chmod(0o755)
    (base / "shared").mkdir(mode=0o1777)
    (base / "shared").chmod(0o1777)
    yield base / "shared"
    shutil.rmtree(base)


@pytest.fixture
def root_only(tmp_path: Path) -> Path:
    """A directory only root may change, with a file the attack aims at."""
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "precious").write_text("keep me")
    return secret


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def small_image(tmp_path: Path) -> str:
    layout = tmp_path / "layout"
    write_oci_layout(layout, [build_tar([file("bin/sh", b"#!/bin/true\n", 0o755)])],
                     tag="small")
    return f"oci:{layout}:small"


def test_a_planted_dead_looking_scratch_dir_beside_dest_is_not_touched(
        tmp_path: Path, ocistage: OcistageRunner, shared: Path, root_only: Path) -> None:
    planted = shared / f".dest.ocistage-{socket.gethostname()}-{dead_pid()}-0badc0de"
    as_nobody("mkdir", "-p", f"{planted}/sub")
    as_nobody("touch", f"{planted}/sub/theirs")
    # the link is there before ocistage looks: a removal following it would empty root-only
    as_nobody("ln", "-s", str(root_only), f"{planted}/link")
    os.symlink(root_only, planted / "rootlink")  # even a link root planted is not followed
    made = ocistage("bundle", small_image(tmp_path), str(shared / "dest"), "--cmd", "/bin/sh")
    assert made.returncode == 0, made.stderr
    assert (shared / "dest" / "rootfs" / "bin" / "sh").is_file()
    assert (root_only / "precious").read_text() == "keep me"
    assert sorted(p.name for p in planted.iterdir()) == ["link", "rootlink", "sub"]
    assert (planted / "sub" / "theirs").exists()
