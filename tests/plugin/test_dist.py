"""``make dist`` builds the wheel a site installs (issue 38): with the venv only, installing
nothing on the machine, and never from a stale ``build/``."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pytest_ocistage.components import require_binary
from tests.plugin.checkout import checkout_copy


def _make(source: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    return subprocess.run(["make", "--no-print-directory", "-C", str(source), *args,
                           f"VENV={sys.prefix}"], capture_output=True, text=True, timeout=600,
                          check=False, env=env)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_binary("make")
    if not (Path(sys.prefix) / "ocistage-installed.stamp").is_file():
        pytest.skip("the tests do not run in a venv made by `make venv`")
    return checkout_copy(tmp_path_factory.mktemp("dist") / "ocistage")


def test_make_dist_installs_nothing(source: Path) -> None:
    planned = _make(source, "-n", "dist")
    assert planned.returncode == 0, planned.stderr
    assert "apt-get" not in planned.stdout and "pip install" not in planned.stdout, \
        planned.stdout


def test_a_module_left_in_an_old_build_is_not_shipped(source: Path) -> None:
    stale = source / "build" / "lib" / "ocistage" / "cache" / "removed_module.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("STALE = True\n")
    built = _make(source, "dist")
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (source / "dist").glob("ocistage-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "ocistage/cache/store.py" in names
    assert not any(name.endswith("removed_module.py") for name in names)
    assert not (source / "build").exists()
