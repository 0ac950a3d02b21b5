"""The real pyxis cluster's parts as plain functions: enroot and pyxis, the installed importer,
the logging mksquashfs and the cluster spec (tests/e2e/test_pyxis_importer.py, bench/pyxisnodes.py).

- :func:`enroot_pyxis_prefix`: the prefix with ``enroot/`` and ``pyxis/`` (pyxis 0.24.0, enroot
  4.1.2) that ``.ci/build-enroot-pyxis.sh`` builds once per machine into
  ``/opt/ocistage-enroot-pyxis/<key>`` (or ``$OCISTAGE_ENROOT_PYXIS_PREFIX``);
- :func:`installed_importer`: this checkout's wheel installed into a venv under /tmp made with
  Debian's /usr/bin/python3, so that an unprivileged job user can run its
  ``ocistage-pyxis-importer``;
- :func:`logging_mksquashfs`: a directory every user reaches with a ``mksquashfs`` that appends
  ``UID OUTPUT`` to its ``builds.log`` and runs the real one (:func:`mksquashfs_builds` reads it);
- :func:`pyxis_spec`: the built 24.05 three-node cluster with pyxis loaded
  (``importer=... use_squashfuse=1``), start it with ``pytest_ocistage.slurm.session_cluster``;
- :func:`job_export`: srun's ``--export=`` of one user's caches (the importer's store:
  ``OCISTAGE_CACHE=HOME/cache``, one directory every node of this host sees).

What cannot be had here raises :class:`~pytest_ocistage.clusterspec.ClusterError`; the tests'
fixtures turn that into a skip, the bench into a message.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pytest_ocistage.clusterspec import ClusterError, ClusterSpec, built_spec

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / ".ci" / "build-enroot-pyxis.sh"
SYSTEM_PYTHON = Path("/usr/bin/python3")


def enroot_pyxis_prefix() -> Path:
    """The prefix with enroot/ and pyxis/ (built now if this machine has none yet)."""
    configured = os.environ.get("OCISTAGE_ENROOT_PYXIS_PREFIX")
    if configured:
        return Path(configured)
    result = subprocess.run(["bash", str(BUILD_SCRIPT), str(built_spec().prefix)],
                            capture_output=True, text=True, timeout=1800, check=False,
                            stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise ClusterError(f"enroot and pyxis could not be built by {BUILD_SCRIPT}:\n"
                           f"{result.stderr[-2000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


@contextmanager
def installed_importer() -> Iterator[Path]:
    """The installed ``ocistage-pyxis-importer`` in a venv every user can run (removed on exit).

    Raises ClusterError when /usr/bin/python3 is missing, RuntimeError when the wheel does not
    build or install."""
    if not SYSTEM_PYTHON.is_file():
        raise ClusterError(f"{SYSTEM_PYTHON} is missing: the job user's venv is made with it")
    base = Path(tempfile.mkdtemp(prefix="ocistage-pyxis-venv-", dir="/tmp"))
    try:
        base.chmod(0o755)
        wheel_dir = base / "wheel"
        # from a copy without build leftovers: a stale build/ or *.egg-info of the checkout
        # can give a wheel without the newest entry points
        source = base / "src"
        shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", "build", "*.egg-info", ".venv", "__pycache__", "state", "dist", "results"))
        # a checkout on PYTHONPATH (its ocistage.egg-info) would count as installed
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        built = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
             "-w", str(wheel_dir), str(source)], capture_output=True, text=True, timeout=600,
            check=False)
        if built.returncode != 0:
            raise RuntimeError(f"pip wheel failed:\n{built.stdout}{built.stderr}")
        venv = base / "venv"
        subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv)],
                       check=True, timeout=120)
        python = venv / "bin" / "python"
        site = Path(subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True).stdout.strip())
        installed = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
             "--no-index", "--ignore-installed", "-q", *map(str, wheel_dir.glob("*.whl"))],
            capture_output=True, text=True, timeout=300, check=False, env=clean)
        if installed.returncode != 0:
            raise RuntimeError(f"pip install failed:\n{installed.stdout}{installed.stderr}")
        # the dependencies from this environment (world-readable), not its ocistage
        # (written after the install: pip would take that environment's ocistage for ours)
        (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        script = venv / "bin" / "ocistage-pyxis-importer"
        if not script.is_file():
            raise RuntimeError(f"the wheel installed no {script.name}")
        yield script
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def logging_mksquashfs() -> Iterator[Path]:
    """A directory every user reaches, with a ``mksquashfs`` that logs its builds to
    ``builds.log`` and runs the real one (removed on exit)."""
    real = shutil.which("mksquashfs")
    if real is None:
        raise ClusterError("mksquashfs is not installed (squashfs-tools)")
    base = Path(tempfile.mkdtemp(prefix="ocistage-pyxis-tools-", dir="/tmp"))
    try:
        base.chmod(0o755)
        log = base / "builds.log"
        log.touch()
        log.chmod(0o666)
        wrapper = base / "mksquashfs"
        wrapper.write_text(f'#!/bin/sh\ncase "$2" in ""|-*) ;; *) echo "$(id -u) $2" >> {log};; '
                           f'esac\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def mksquashfs_builds(tools: Path) -> list[str]:
    """The builds the wrapper of :func:`logging_mksquashfs` logged so far (``UID OUTPUT``)."""
    return (tools / "builds.log").read_text().splitlines()


def pyxis_spec(name: str, enroot_pyxis: Path, importer: Path, tools: Path, *,
               enroot_bin: Path | None = None, site_config: str = "") -> ClusterSpec:
    """The built 24.05 cluster with pyxis loaded (``importer=``, ``use_squashfuse=1``),
    ``tools`` and enroot's bin (``enroot_bin``, else the built one's) first on the daemons'
    PATH, a 0666 /dev/fuse for job users, and ``site_config`` as the nodes' site config."""
    return dataclasses.replace(
        built_spec(), name=name,
        plugstack=(f"required {enroot_pyxis / 'pyxis' / 'spank_pyxis.so'} "
                   f"importer={importer} use_squashfuse=1\n"),
        daemon_path=(str(tools), str(enroot_bin or enroot_pyxis / "enroot" / "bin")),
        user_fuse=True, site_config=site_config)


def job_export(home: Path, uid: int) -> str:
    """srun's ``--export=`` giving the user ``uid`` caches under ``home`` (the importer's store
    ``home/cache``; enroot's XDG directories) and a ``/run/user/UID`` (made here)."""
    runtime = Path("/run/user") / str(uid)
    runtime.mkdir(parents=True, exist_ok=True)
    os.chown(runtime, uid, -1)
    runtime.chmod(0o700)
    return (f"--export=ALL,OCISTAGE_CACHE={home}/cache,XDG_CACHE_HOME={home}/xdg-cache,"
            f"XDG_DATA_HOME={home}/xdg-data,XDG_RUNTIME_DIR={runtime},HOME={home}")
