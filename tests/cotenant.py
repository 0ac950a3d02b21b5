"""A second, unprivileged user on this host for the multi-user tests (docs/trust.md): the
co-tenant is ``nobody``, run through ``setpriv``, in a sticky world-writable directory like
``/tmp`` or ``/scratch``."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

NOBODY = 65534

#: the tests that need a second user: root (to become it) and setpriv
second_user = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                 reason="a second user needs root and setpriv")


def as_nobody(*argv: str) -> None:
    """Run ``argv`` as ``nobody`` (no supplementary groups), from ``/``."""
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                    *argv], check=True, timeout=60, cwd="/")


@contextmanager
def sticky_directory(prefix: str) -> Iterator[Path]:
    """A sticky, world-writable directory in a root-owned 0755 one under /tmp (pytest's
    tmp_path is private to its owner, so nobody could not reach it); removed after."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    base.chmod(0o755)
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    try:
        yield shared
    finally:
        shutil.rmtree(base)
