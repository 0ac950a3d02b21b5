"""The ``needs_root`` marker and ``require_root()`` (issue 34): a user's run skips them with one
reason and never fails them, also under OCISTAGE_REQUIRE_E2E=1, while a missing component
still fails there; root's run includes them. The project below runs in a pytest of its own, as
this user (as nobody when the suite runs as root) and, when the suite is root's, as root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ocistage.components import NEEDS_ROOT_REASON, require_binary, running_as_root

NOBODY = 65534
PROJECT = '''
import pytest

from pytest_ocistage.components import require_binary, require_root


@pytest.mark.needs_root("why it needs root")
def test_marked():
    assert False, "the marked test ran"


@pytest.fixture
def rooted():
    require_root()


def test_from_a_fixture(rooted):
    assert False, "the fixture let it run"


def test_missing_component():
    require_binary("ocistage-test-no-such-tool", "ocistage-test-no-such-package")
'''


@pytest.fixture
def project() -> Iterator[Path]:
    """A project outside pytest's own temp dirs (root's are private), readable by nobody."""
    top = Path(tempfile.mkdtemp(prefix="ocistage-needs-root-", dir="/tmp"))
    try:
        top.chmod(0o755)
        (top / "test_project.py").write_text(PROJECT)
        (top / "test_project.py").chmod(0o644)
        yield top
    finally:
        shutil.rmtree(top)


def run(project: Path, *, as_user: bool) -> subprocess.CompletedProcess[str]:
    prefix: list[str] = []
    if as_user and running_as_root():
        prefix = [require_binary("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}",
                  "--clear-groups"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(project),
           "OCISTAGE_REQUIRE_E2E": "1"}
    return subprocess.run([*prefix, sys.executable, "-m", "pytest", "-rsf", "-p",
                           "no:cacheprovider", "--rootdir", str(project), str(project)],
                          capture_output=True, text=True, cwd=project, env=env, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_a_user_skips_root_only_tests_with_one_reason_and_fails_a_missing_component(
        project: Path) -> None:
    result = run(project, as_user=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 2 skipped" in result.stdout, result.stdout
    assert result.stdout.count(NEEDS_ROOT_REASON) == 2, result.stdout
    assert "ocistage-test-no-such-package" in result.stdout


@pytest.mark.needs_root("the project runs as root")
def test_root_runs_root_only_tests(project: Path) -> None:
    result = run(project, as_user=False)
    assert "3 failed" in result.stdout, result.stdout
    assert "the marked test ran" in result.stdout and "the fixture let it run" in result.stdout
