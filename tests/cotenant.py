"""A second, unprivileged user on this host for the multi-user tests (docs/trust.md): the
co-tenant is ``nobody``, run through ``setpriv``, in a sticky world-writable directory like
``/tmp`` or ``/scratch``; :func:`created_user` makes a third (``useradd``), removed after.
:class:`User` runs the ``ocistage`` command of this environment as any of them."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_ocistage.components import require_binary

NOBODY = 65534

#: the tests that need a second user: root (to become it) and setpriv
second_user = pytest.mark.needs_root("a second user needs root and setpriv")


def require_python_for(uid: int = NOBODY, module: str = "ocistage") -> None:
    """Skip when uid cannot run this interpreter with ``module`` on this checkout: a venv or a
    checkout below a directory only root enters (CI's clone under a 0700 /root). For root's
    tests that run Python as another user; that user's own run covers the rest."""
    usable = subprocess.run([require_binary("setpriv"), f"--reuid={uid}", f"--regid={uid}",
                             "--clear-groups", sys.executable, "-c", f"import {module}"],
                            cwd="/", capture_output=True, text=True, check=False, timeout=60)
    if usable.returncode != 0:
        pytest.skip(f"uid {uid} cannot run this interpreter ({sys.executable}) with {module} "
                    f"on this checkout (below a directory only root enters?): "
                    f"{usable.stderr.strip()[-200:]}")


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


#: the ``ocistage`` command of the environment the tests run in
OCISTAGE = str(Path(sys.executable).parent / "ocistage")


@dataclass(frozen=True)
class User:
    """A user of this host whom commands run as (through ``setpriv``, but for root), with a
    home of their own under ``homes`` (a directory every user can reach) holding their
    cache."""

    name: str
    uid: int
    gid: int

    def argv(self, *argv: str) -> list[str]:
        if self.uid == os.geteuid():
            return list(argv)
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                *argv]

    def home(self, homes: Path) -> Path:
        home = homes / self.name
        if not home.is_dir():
            home.mkdir(mode=0o700)
            os.chown(home, self.uid, self.gid)
        return home

    def env(self, homes: Path) -> dict[str, str]:
        home = self.home(homes)
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                "OCISTAGE_CACHE": str(home / "cache"), "LANG": "C.UTF-8"}

    def ocistage(self, homes: Path, *args: str,
                 timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``ocistage ARGS`` as this user, from ``/``."""
        return subprocess.run(self.argv(OCISTAGE, *args), env=self.env(homes), cwd="/",
                              capture_output=True, text=True, timeout=timeout, check=False)

    def start(self, homes: Path, *args: str) -> subprocess.Popen[str]:
        """``ocistage ARGS`` as this user, started (not waited for)."""
        return subprocess.Popen(self.argv(OCISTAGE, *args), env=self.env(homes), cwd="/",
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


NOBODY_USER = User("nobody", NOBODY, NOBODY)
ROOT = User("root", 0, 0)


def _retried(argv: list[str]) -> None:
    """Run ``argv`` (useradd, userdel), again while another process holds /etc/passwd."""
    deadline = time.monotonic() + 60
    while True:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if result.returncode == 0:
            return
        if "lock" not in result.stderr or time.monotonic() > deadline:
            raise AssertionError(f"{argv}: {result.stderr}")
        time.sleep(0.2)


@contextmanager
def created_user() -> Iterator[User]:
    """A new unprivileged user (``useradd``, no home, a group of its own), removed with its
    group afterwards (``userdel``)."""
    for tool in ("useradd", "userdel"):
        require_binary(tool)
    name = f"ocst{uuid.uuid4().hex[:8]}"
    _retried(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
    try:
        entry = pwd.getpwnam(name)
        yield User(name, entry.pw_uid, entry.pw_gid)
    finally:
        _retried(["userdel", name])


@contextmanager
def ordinary_user() -> Iterator[User]:
    """An ordinary user who runs this environment's ``ocistage``: one made for the test
    (:func:`created_user`) when pytest runs as root, else the caller, so a user's story is
    tested as a user in root's run and in a user's run alike."""
    if os.geteuid() != 0:
        entry = pwd.getpwuid(os.geteuid())
        yield User(entry.pw_name, entry.pw_uid, os.getegid())
        return
    with created_user() as made:
        require_python_for(made.uid)
        yield made


@contextmanager
def reachable_directory(tmp_path: Path) -> Iterator[Path]:
    """A directory :func:`ordinary_user` reaches (for homes, sources, targets): ``tmp_path``
    for the caller, a 0755 one in /tmp under root (root's tmp_path is root's alone), removed
    after."""
    if os.geteuid() != 0:
        yield tmp_path
        return
    base = Path(tempfile.mkdtemp(prefix="ocistage-user-", dir="/tmp"))
    try:
        base.chmod(0o755)
        yield base
    finally:
        subprocess.run(["rm", "-rf", "--", str(base)], check=True, timeout=120)

