"""ocistage lives in a user's environment beside the user's own code (issue 24).

The distribution is built as a wheel and installed into a fresh virtual environment, as a user
installs it. Installed, it adds two import names, ``ocistage`` and ``pytest_ocistage``, and the
pytest plugin loads into every pytest run there. A user's project whose own top-level
``cache.py``, ``bundler.py``, ``stagers/`` and ``runtimes/`` have the names of this
repository's folders runs its test suite with the plugin's fixtures, and its imports get its
own modules.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.plugin.checkout import checkout_copy

REPO = Path(__file__).resolve().parents[2]

USER_TEST = '''
"""The user's own modules, and ocistage's fixtures beside them."""

import bundler
import cache
import runtimes
import stagers


def test_my_modules_are_mine():
    assert (cache.WHO, bundler.WHO, stagers.WHO, runtimes.WHO) == ("user",) * 4


def test_the_plugin_serves_my_image(oci_registry, oci_image, ocistage, tmp_path):
    from pytest_ocistage import File, busybox_layer

    image = oci_image([busybox_layer(), {"app/hello": File("hi\\n")}], cmd=["/bin/true"])
    pushed = image.push(oci_registry, "team/coexist")
    made = ocistage("bundle", pushed.ref, str(tmp_path / "bundle"), check=True)
    assert (Path(made.stdout.strip()) / "rootfs/app/hello").read_text() == "hi\\n"
    assert cache.WHO == "user"


from pathlib import Path  # noqa: E402
'''


def _clean_env() -> dict[str, str]:
    """The environment without a checkout on PYTHONPATH (pip would take its egg-info for an
    installed distribution)."""
    return {key: value for key, value in os.environ.items()
            if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "OCISTAGE")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout's files, built offline (the test environment has
    setuptools) from a copy, so the build leaves nothing in the checkout."""
    source = checkout_copy(tmp_path_factory.mktemp("source") / "ocistage")
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=600, check=False, env=_clean_env(),
        cwd=tmp_path_factory.getbasetemp())
    assert built.returncode == 0, built.stdout + built.stderr
    [found] = out.glob("ocistage-*.whl")
    return found


def test_the_wheel_adds_only_the_two_import_names(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(
        (".dist-info", ".data"))}
    assert tops == {"ocistage", "pytest_ocistage"}
    for module in ("ocistage/bundler/cli/app.py", "ocistage/cache/store.py",
                   "ocistage/stagers/directory.py", "ocistage/runtimes/scrun.py",
                   "ocistage/runtimes/scrun.lua.in",
                   "ocistage/errors.py", "ocistage/bundler/flows/bundle.py",
                   "ocistage/bundler/image/schemas/image-manifest.json",
                   "ocistage/__main__.py", "ocistage/py.typed"):
        assert module in names, module


@pytest.mark.e2e
def test_a_user_project_with_our_folder_names_runs_its_tests(wheel: Path,
                                                             tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    # ocistage's dependencies (and pytest) from this test environment: read through a path
    # entry, whose own .pth files (this checkout's editable install) are not processed. The
    # wheel installs into the new environment's site-packages, which comes first.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        capture_output=True, text=True, timeout=300, check=False, env=_clean_env(),
        cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "cache.py").write_text('WHO = "user"\n')
    (project / "bundler.py").write_text('WHO = "user"\n')
    for package in ("stagers", "runtimes"):
        (project / package).mkdir()
        (project / package / "__init__.py").write_text('WHO = "user"\n')
    (project / "conftest.py").write_text("import cache  # loaded after the plugin\n\n"
                                         "assert cache.WHO == 'user'\n")
    (project / "tests" / "test_mine.py").write_text(textwrap.dedent(USER_TEST))
    env = _clean_env()
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    result = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
    where = subprocess.run(
        [str(python), "-c", "import ocistage, pytest_ocistage; "
         "print(ocistage.__file__); print(pytest_ocistage.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(path.startswith(str(site)) for path in where), where
    runs = subprocess.run([str(venv / "bin" / "ocistage"), "--version"], env=env,
                          capture_output=True, text=True, check=False)
    module = subprocess.run([str(python), "-m", "ocistage", "--version"], env=env, cwd=project,
                            capture_output=True, text=True, check=False)
    assert runs.returncode == module.returncode == 0
    assert runs.stdout == module.stdout and runs.stdout.startswith("ocistage ")
