"""A group-shared cache with members who are real users (docs/trust.md, "Group-shared caches"):
a group and two users made here with ``useradd`` (the group a supplementary one; removed after),
a root-owned cache of that group with mode 2775, members running the real ``ocistage`` CLI
through ``setpriv`` with umask 002, and root as the site admin (with the group among its own)."""

from __future__ import annotations

import contextlib
import dataclasses
import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_ocistage.components import require_binary, require_root

OCISTAGE = Path(sys.executable).parent / "ocistage"


@dataclass(frozen=True)
class Member:
    name: str
    uid: int
    gid: int
    home: Path


@dataclass(frozen=True)
class GroupCache:
    base: Path               # reachable by every member; the cache and homes are in it
    cache: Path
    gid: int
    a: Member
    b: Member

    def argv(self, who: Member | None, *args: str, program: Sequence[str] = (str(OCISTAGE),),
             env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
        """The command line and environment of ``ocistage ARGS`` (``program`` instead of
        ``ocistage``) on the cache as member ``who`` (None: root, with the cache's group
        among its groups), umask 002; ``env`` adds to its environment."""
        argv = ["sh", "-c", 'umask 002; exec "$@"', "sh", *program, *args]
        environment = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8",
                       "OCISTAGE_CACHE": str(self.cache), "NO_PROXY": "127.0.0.1,localhost"}
        if who is not None:
            argv = ["setpriv", f"--reuid={who.uid}", f"--regid={who.gid}",
                    f"--groups={self.gid}", *argv]
            environment["HOME"] = str(who.home)
        else:
            argv = ["setpriv", f"--groups=0,{self.gid}", *argv]
            environment["HOME"] = "/root"
        return argv, {**environment, **(env or {})}

    def run(self, who: Member | None, *args: str, expect: int | None = 0,
            program: Sequence[str] = (str(OCISTAGE),), env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run ``ocistage ARGS`` (or ``program ARGS``) as ``who``; its exit status must be
        ``expect`` (unless None)."""
        argv, env = self.argv(who, *args, program=program, env=env)
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300,
                              cwd="/", check=False, stdin=subprocess.DEVNULL)
        if expect is not None:
            assert done.returncode == expect, (args, who, done.stdout, done.stderr)
        return done

    def start(self, who: Member | None, *args: str, program: Sequence[str] = (str(OCISTAGE),)
              ) -> subprocess.Popen[str]:
        """``ocistage ARGS`` as ``who``, running (its own process group, to be killed)."""
        argv, env = self.argv(who, *args, program=program)
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd="/", start_new_session=True)

    @staticmethod
    def kill(process: subprocess.Popen[str]) -> None:
        """SIGKILL ``process`` and everything it started (its process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=60)

    def gc(self, who: Member | None, *args: str) -> dict[str, Any]:
        """``cache gc --json ARGS`` as ``who`` (it must exit 0): its report."""
        report: dict[str, Any] = json.loads(self.run(who, "cache", "gc", "--json", *args).stdout)
        return report

    def entries(self, directory: str) -> dict[str, int]:
        """The entries of ``CACHE/directory`` and their owners."""
        with contextlib.suppress(FileNotFoundError), os.scandir(self.cache / directory) as it:
            return {e.name: e.stat(follow_symlinks=False).st_uid for e in it}
        return {}


def _add_user(name: str, group: str) -> Member:
    subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh",
                    "--groups", group, name], check=True, capture_output=True, timeout=60)
    entry = pwd.getpwnam(name)
    return Member(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


@contextlib.contextmanager
def group_cache_members() -> Iterator[GroupCache]:
    """Two members of a group (made here, removed after) and root's 2775 cache of it, in a
    directory under /tmp every member reaches (removed after)."""
    require_root()  # members made with useradd need root
    for tool in ("setpriv", "useradd", "userdel", "groupadd", "groupdel"):
        require_binary(tool)
    if OCISTAGE.stat().st_mode & 0o005 != 0o005:
        pytest.skip(f"{OCISTAGE} is not usable by other users")
    tag = f"ocgc{os.getpid() % 100000}"
    base = Path(tempfile.mkdtemp(prefix="ocistage-group-", dir="/tmp"))
    users: list[str] = []
    group_made = False
    try:
        base.chmod(0o755)
        subprocess.run(["groupadd", tag], check=True, capture_output=True, timeout=60)
        group_made = True
        gid = grp.getgrnam(tag).gr_gid
        members = []
        for suffix in ("a", "b"):
            users.append(f"{tag}{suffix}")
            member = _add_user(users[-1], tag)
            home = base / f"home-{suffix}"
            home.mkdir(mode=0o700)
            os.chown(home, member.uid, member.gid)
            members.append(dataclasses.replace(member, home=home))
        cache = base / "cache"
        cache.mkdir()
        os.chown(cache, 0, gid)
        cache.chmod(0o2775)
        yield GroupCache(base, cache, gid, members[0], members[1])
    finally:
        shutil.rmtree(base, ignore_errors=True)
        for user in users:
            subprocess.run(["userdel", user], capture_output=True, timeout=60, check=False)
        if group_made:
            subprocess.run(["groupdel", tag], capture_output=True, timeout=60, check=False)
