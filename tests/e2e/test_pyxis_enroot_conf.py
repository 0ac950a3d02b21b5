"""pyxis with ocistage-pyxis-importer (``use_squashfuse=1``) for an unprivileged job user who
has no ``/run/user/UID`` on the nodes (no login session there), with enroot's default
enroot.conf and with the one setting docs/site.md gives a site ("pyxis with enroot"):
``ENROOT_RUNTIME_PATH`` under the directory pyxis makes for each job user as root
(``runtime_path/UID``, default ``/run/pyxis/UID``, the user's, 0700).

- defaults, an ``XDG_RUNTIME_DIR`` the node lacks (the login node's ``/run/user/UID``, passed
  on by srun; here ``/run/ocistage-no-session/UID``, since the test user's ``/run/user/UID``
  exists on this host): enroot stops at once, ``mkdir: cannot create directory ...:
  Permission denied``;
- the site's setting: runs with such an ``XDG_RUNTIME_DIR`` and without one, enroot's runtime
  directory in ``/run/pyxis/UID``.

(Defaults without ``XDG_RUNTIME_DIR`` put enroot's runtime directory at ``/run/enroot``, which a
user cannot make; whether that fails here depends on whether root's runs made it before, so it
is not tested.)

enroot compiles its sysconfdir into ``bin/enroot``, so the test runs a copy of the built
enroot's ``bin/`` whose sysconfdir is a copy of its ``etc/enroot`` with the enroot.conf under
test (the library stays the built one); the built prefix is not changed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ocistage.jobuser import JobUser
from pytest_ocistage.runner import ocistage_command
from pytest_ocistage.slurm import SlurmCluster, session_cluster
from tests.e2e import test_pyxis_importer as pyxis_tests

# the pyxis test module's fixtures: the built enroot and pyxis, the importer's venv, the
# mksquashfs wrapper, the pushed images
enroot_pyxis = pyxis_tests.enroot_pyxis
importer = pyxis_tests.importer
tools = pyxis_tests.tools
pushed = pyxis_tests.pushed

pytestmark = pytest.mark.timeout(900)

#: enroot.conf: as installed (every line a comment), and with the line docs/site.md gives
#: (enroot evaluates the value: $(id -u) is the job user's uid)
CONFS = {"default": "# enroot's defaults\n",
         "site": "ENROOT_RUNTIME_PATH /run/pyxis/$(id -u)/enroot\n"}


@pytest.fixture(scope="module", params=sorted(CONFS))
def site_enroot(request: pytest.FixtureRequest, enroot_pyxis: Path) -> Iterator[Path]:
    """A copy of the built enroot's bin/ and etc/ whose enroot.conf is one of :data:`CONFS`."""
    built = enroot_pyxis / "enroot"
    base = Path(tempfile.mkdtemp(prefix="ocistage-enroot-conf-", dir="/tmp"))
    try:
        base.chmod(0o755)
        copy = base / "enroot"
        copy.mkdir(mode=0o755)
        # -a keeps the helpers' file capabilities (enroot's `make setcap`)
        subprocess.run(["cp", "-a", str(built / "bin"), str(built / "etc"), str(copy)],
                       check=True, timeout=60)
        (copy / "etc" / "enroot" / "enroot.conf").write_text(CONFS[request.param])
        script = copy / "bin" / "enroot"
        text = script.read_text()
        old, new = str(built / "etc" / "enroot"), str(copy / "etc" / "enroot")
        assert old in text
        script.write_text(text.replace(old, new))
        yield copy
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def conf_cluster(enroot_pyxis: Path, importer: Path, tools: Path,
                 site_enroot: Path) -> Iterator[SlurmCluster]:
    name = "pyxisconf" + ("s" if "RUNTIME" in
                          (site_enroot / "etc/enroot/enroot.conf").read_text() else "d")
    spec = pyxis_tests.pyxis_spec(name, enroot_pyxis, importer, tools,
                                  enroot_bin=site_enroot / "bin")
    with session_cluster(spec, ocistage_command()) as cluster:
        yield cluster


@pytest.mark.parametrize("xdg", ["unset", "absent-on-node"])
def test_a_job_user_without_run_user_on_the_nodes(
        conf_cluster: SlurmCluster, pushed: dict[str, str], slurm_job_user: JobUser,
        site_enroot: Path, xdg: str) -> None:
    user = slurm_job_user
    site = "RUNTIME" in (site_enroot / "etc" / "enroot" / "enroot.conf").read_text()
    if not site and xdg == "unset":
        pytest.skip("depends on whether /run/enroot exists (see the module docstring)")
    runtime = Path(f"/run/pyxis/{user.uid}/enroot")
    login_runtime = Path(f"/run/ocistage-no-session/{user.uid}")
    assert not login_runtime.exists()
    made_runtime = not runtime.exists()
    home = Path(tempfile.mkdtemp(prefix="ocistage-enroot-home-", dir="/tmp"))
    try:
        home.chmod(0o700)
        os.chown(home, user.uid, user.gid)
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("XDG_", "ENROOT_", "OCISTAGE_"))}
        export = f"--export=ALL,HOME={home}"
        if xdg == "absent-on-node":
            export += f",XDG_RUNTIME_DIR={login_runtime}"
        result = conf_cluster.srun(
            "-N3", "--ntasks-per-node=1", export, f"--container-image={pushed['zstd']}",
            "id", "-u", user=user, env=env, cwd=Path("/tmp"), timeout=600)
        if not site and xdg == "absent-on-node":
            assert result.returncode != 0, result.stdout
            # `mkdir -p` of the first missing directory; quoted '...' or with the locale's marks
            refused = ("mkdir: cannot create directory ." + re.escape(str(login_runtime.parent))
                       + ".: Permission denied")
            assert re.search(refused, result.stderr), result.stderr
            return
        logs = "".join(p.read_text(errors="replace")[-3000:]
                       for p in sorted(conf_cluster.log_dir.glob("slurmd-*.log")))
        assert result.returncode == 0, result.stdout + result.stderr + logs
        assert result.stdout.splitlines() == [str(user.uid)] * 3, result.stdout
        if site:  # where enroot's runtime directory went: pyxis's per-user directory
            assert runtime.is_dir() and runtime.stat().st_uid == user.uid
    finally:
        shutil.rmtree(home, ignore_errors=True)
        if made_runtime:
            shutil.rmtree(runtime, ignore_errors=True)
