"""A user's cache is private (issue 34): images pulled from a private registry must not be
readable by the other users of the host. Run as an ordinary user: ``nobody`` through setpriv
when the suite runs as root, the developer as themselves otherwise."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ocistage.components import require_binary, require_root
from tests.cotenant import require_python_for

NOBODY = 65534
OPEN = ("import sys; from ocistage.cache.store import Store; "
        "[print('warning:', n, file=sys.stderr) for n in Store.open(sys.argv[1]).notices]")


def _as_user() -> list[str]:
    """The prefix that runs a command as an ordinary user: nobody for root, else nothing."""
    if os.geteuid() != 0:
        return []
    require_binary("setpriv")
    require_python_for(NOBODY)
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.fixture
def home() -> Iterator[Path]:
    """A directory of the ordinary user's, outside root's private pytest tmp dirs."""
    base = Path(tempfile.mkdtemp(prefix="ocistage-private-", dir="/tmp"))
    if os.geteuid() == 0:
        os.chown(base, NOBODY, NOBODY)
    try:
        yield base
    finally:
        shutil.rmtree(base)


def _open(cache: Path) -> str:
    result = subprocess.run([*_as_user(), sys.executable, "-c", OPEN, os.fspath(cache)],
                            cwd="/", capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stderr


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_cache_is_owner_only(home: Path) -> None:
    cache = home / ".cache" / "ocistage"
    assert _open(cache) == ""
    assert _mode(cache) == 0o700


def test_an_open_cache_is_tightened_once_with_one_warning(home: Path) -> None:
    cache = home / "cache"
    _open(cache)
    os.chmod(cache, 0o755)  # as the releases before this one made it (root may chmod it)
    said = _open(cache)
    assert _mode(cache) == 0o700
    assert said.count("warning:") == 1 and "private" in said and str(cache) in said, said
    assert _open(cache) == ""


def test_a_group_shared_cache_keeps_its_mode(home: Path) -> None:
    cache = home / "cache"
    _open(cache)
    os.chmod(cache, 0o2775)
    assert _open(cache) == ""
    assert _mode(cache) == 0o2775


def test_roots_cache_keeps_the_mode_its_maker_gave_it(tmp_path: Path) -> None:
    require_root()  # a root-owned cache is the site's: only root makes one
    from ocistage.cache.store import Store

    cache = tmp_path / "site"
    cache.mkdir(mode=0o755)
    os.chmod(cache, 0o755)
    Store.open(cache)
    assert _mode(cache) == 0o755
