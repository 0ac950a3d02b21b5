"""`make venv`, which `make demo` and `make test` run first, with Debian's own python3 and a
stock PATH: Debian's python3 is "externally managed" (PEP 668) and refuses `pip install`
outside a virtual environment, so the package must land in one, made by that python3."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pytest_ocistage.components import component_unavailable, require_binary

REPO = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = Path("/usr/bin/python3")
STOCK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def externally_managed() -> bool:
    result = subprocess.run([str(DEBIAN_PYTHON), "-c",
                             "import sysconfig, os; print(os.path.exists(os.path.join("
                             "sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))"],
                            capture_output=True, text=True, check=False)
    return result.stdout.strip() == "True"


def test_make_venv_installs_into_a_venv_of_debians_python(tmp_path: Path) -> None:
    require_binary("make")
    if not DEBIAN_PYTHON.exists() or not externally_managed():
        component_unavailable("needs Debian's externally managed /usr/bin/python3 (PEP 668): "
                              "apt-get install python3")
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "MAKEFLAGS", "MAKELEVEL")}
    env["PATH"] = STOCK_PATH  # no pyenv shim, no venv: python3 is Debian's
    venv = tmp_path / "venv"
    made = subprocess.run(["make", "-C", str(REPO), "venv", f"VENV={venv}"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "externally-managed-environment" not in made.stderr
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import sys, ocistage; print(sys.base_prefix, ocistage.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["/usr", str(REPO / "ocistage" / "__init__.py")]
    version = subprocess.run([str(venv / "bin" / "ocistage"), "--help"], env=env,
                             capture_output=True, text=True, check=False)
    assert version.returncode == 0 and "bundle" in version.stdout
    for tool in ("pytest", "ruff", "mypy"):  # what make lint/typecheck/unit call
        assert (venv / "bin" / tool).is_file()
    again = subprocess.run(["make", "-C", str(REPO), "venv", f"VENV={venv}"], env=env,
                           capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0 and "pip install" not in again.stdout  # done once
