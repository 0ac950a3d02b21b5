"""A cache, a staged bundle and a pyxis store made by an earlier commit's code are used as they
are by this checkout's (docs/site.md, "Upgrades"; issue 38).

The earlier code is commit :data:`PREVIOUS` (the main branch landed before the site install),
taken from git history with ``git archive`` and run from that tree (its ``ocistage/`` links
the packages, so ``PYTHONPATH`` runs it with this venv's dependencies). If a format is bumped
on purpose (``BUNDLE_FORMAT``, ``IMAGE_FORMAT``, the cache layout), this test fails: say in
docs/site.md what an upgrade then does to existing caches and stores, and change the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_ocistage.components import Registry, require_binary
from pytest_ocistage.imagebuild import build_image, busybox_layer
from tests.plugin.checkout import REPO

PREVIOUS = "84dbfdb"


def _previous_tree(dest: Path) -> Path:
    """The files of commit PREVIOUS in dest (skips when this clone lacks the history)."""
    git = require_binary("git")
    found = subprocess.run([git, "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"],
                           capture_output=True, check=False)
    if found.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} is not in this clone's history (a shallow clone)")
    archive = subprocess.run([git, "-C", str(REPO), "archive", PREVIOUS], capture_output=True,
                             check=True, timeout=120).stdout
    dest.mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=120)
    return dest


def _env(tmp: Path, pythonpath: str | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("OCISTAGE_") and key != "PYTHONPATH"}
    env.update(OCISTAGE_CACHE=str(tmp / "cache"), OCISTAGE_PYXIS_STORE=str(tmp / "cache"),
               HOME=str(tmp / "home"), XDG_CONFIG_HOME=str(tmp / "home" / ".config"),
               NO_COLOR="1")
    env.pop("SLURM_JOB_ID", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


def _run(env: dict[str, str], module: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = f"import sys; from {module} import main; sys.argv[0] = 'x'; main()"
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                            text=True, env=env, cwd="/", timeout=300, check=False,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, (f"{module} {args} ({env.get('PYTHONPATH') or 'new'}) "
                                    f"exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return result


def test_a_cache_staged_bundle_and_pyxis_store_of_the_previous_code_are_used_as_they_are(
        tmp_path: Path, plain_registry: Registry) -> None:
    skopeo = require_binary("skopeo")
    require_binary("mksquashfs", "squashfs-tools")
    old_tree = _previous_tree(tmp_path / "previous")
    (tmp_path / "home").mkdir()
    build_image(tmp_path / "layout", [busybox_layer()], cmd=["sh", "-c", "echo hi"])
    layout_ref = f"oci:{tmp_path / 'layout'}:latest"
    subprocess.run([skopeo, "copy", "-q", "--dest-tls-verify=false",
                    f"oci:{tmp_path / 'layout'}:latest",
                    f"docker://{plain_registry.host}/upgrade/app:1"], check=True, timeout=120)
    uri = f"docker://{plain_registry.host}#upgrade/app:1"
    old, new = _env(tmp_path, str(old_tree)), _env(tmp_path, None)
    cli = "ocistage.bundler.cli.app"
    # the importer's module as each tree names it (its console script stays the same)
    old_importer, importer = "ocistage.bundler.cli.pyxis", "ocistage.bundler.pyxis.main"
    # the old code really is the old tree's
    where = subprocess.run([sys.executable, "-c", "import ocistage; print(ocistage.__file__)"],
                           capture_output=True, text=True, env=old, cwd="/", check=True)
    assert where.stdout.strip() == str(old_tree / "ocistage" / "__init__.py")

    made = json.loads(_run(old, cli, "bundle", "--json", layout_ref).stdout)
    staged = json.loads(_run(old, cli, "stage", "--json", made["path"], "--to",
                             str(tmp_path / "target"), "--name", "app").stdout)
    image = _run(old, old_importer, "get", uri).stdout.strip()
    _run(old, old_importer, "release")

    # the new code: the same bundle, nothing restaged, the same squashfs image, all verified
    again = json.loads(_run(new, cli, "bundle", "--json", "--pull", "never", layout_ref).stdout)
    assert again["path"] == made["path"] and again["reused"] is True
    assert again["layers_applied"] == 0
    restaged = json.loads(_run(new, cli, "stage", "--json", made["path"], "--to",
                               str(tmp_path / "target"), "--name", "app").stdout)
    assert restaged["path"] == staged["path"]
    assert restaged["copied"] == 0 and restaged["linked"] == 0, restaged
    # the default policy of the importer (missing): the old image, without a build
    assert _run(new, importer, "get", uri).stdout.strip() == image
    _run(new, importer, "release")
    _run(new, cli, "cache", "verify")
    _run(new, cli, "unstage", staged["path"])
    assert not Path(staged["path"]).exists()
    shutil.rmtree(old_tree)
