"""Provides the unprivileged account that end-to-end tests run jobs and commands as (fixture
``slurm_job_user``): made when missing, and then removed again."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_ocistage.components import require_binary, require_root

TEST_USER = "ocistage-slurm"


@dataclass(frozen=True)
class JobUser:
    """An unprivileged account for running jobs as someone other than root."""

    name: str
    uid: int
    gid: int
    home: Path

    def argv(self, *command: str) -> list[str]:
        return ["runuser", "-u", self.name, "--", *command]


@contextmanager
def job_user_account(name: str = TEST_USER, *, login_session: bool = True) -> Iterator[JobUser]:
    """An unprivileged user with a home and a ``/run/user/UID`` (as logind would make), or,
    with ``login_session=False``, without one (a job user on a node it never logged in to:
    the test is skipped if that user has a ``/run/user/UID`` here).

    A user that exists already is used and left alone; one created here is removed (with its
    home and ``/run/user/UID``) on exit.
    """
    require_root()  # creating an unprivileged test user
    require_binary("useradd")
    require_binary("userdel")
    require_binary("runuser")
    created = False
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name],
                       check=True, capture_output=True, timeout=60)
        entry = pwd.getpwnam(name)
        created = True
    run_dir = Path("/run/user") / str(entry.pw_uid)
    made_run_dir = not run_dir.exists()
    if not login_session:
        made_run_dir = False
        if run_dir.exists():
            if created:
                subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60,
                               check=False)
            pytest.skip(f"{name} has a {run_dir}: not a user without a login session")
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        os.chown(run_dir, entry.pw_uid, entry.pw_gid)
        run_dir.chmod(0o700)
    try:
        yield JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    finally:
        if made_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        if created:
            subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60,
                           check=False)
