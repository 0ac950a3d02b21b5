"""What the endurance test (tests/e2e/test_endurance.py) sets up as root and always takes down:
created users in a group of their own, a size-limited tmpfs, and the checks that nothing of
theirs is left running or mounted afterwards."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.procs import running


@dataclass(frozen=True)
class Member:
    """A member of the test group: a created user, or root (``created`` False)."""

    name: str
    uid: int
    gid: int
    home: Path
    created: bool


def _status_uids(pid: str) -> tuple[int, ...]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return tuple(int(field) for field in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()


def processes_of(uids: set[int]) -> dict[int, str]:
    """Live processes (not zombies) with a real, effective or saved uid in ``uids``: pid ->
    command line."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        if not set(_status_uids(entry)[:3]) & uids or not running(int(entry)):
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        found[int(entry)] = " ".join(a.decode(errors="replace") for a in argv if a)
    return found


def kill_processes_of(uids: set[int], timeout: float = 20.0) -> dict[int, str]:
    """SIGKILL every process of ``uids`` (by pid) until none is left or ``timeout`` passes;
    returns those still there."""
    deadline = time.monotonic() + timeout
    left = processes_of(uids)
    while left and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)  # polling /proc for the kills to land, bounded by the deadline
        left = processes_of(uids)
    return left


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` (``/proc/self/mountinfo``), the deepest first."""
    points = []
    prefix = str(path).rstrip("/")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (root 0755); unmounted at the end, whatever happened,
    with whatever got mounted below it."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                   check=True, timeout=30, capture_output=True)
    try:
        yield path
    finally:
        for point in mounts_under(path):
            done = subprocess.run(["umount", point], check=False, timeout=30,
                                  capture_output=True)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", point], check=False, timeout=30,
                               capture_output=True)


@contextlib.contextmanager
def group_members(prefix: str, count: int, homes: Path) -> Iterator[tuple[int, list[Member]]]:
    """A new group and ``count`` new users in it (each with its own user-private group and a
    0700 home under ``homes``), plus root; yields (group id, members with root last). At the
    end the users' processes are killed (by pid) and the users and the group removed."""
    group = f"{prefix}g"
    made: list[str] = []
    uids: set[int] = set()
    subprocess.run(["groupadd", group], check=True, timeout=60, capture_output=True)
    try:
        gid = int(subprocess.run(["getent", "group", group], check=True, timeout=30,
                                 capture_output=True, text=True).stdout.split(":")[2])
        members = []
        for index in range(1, count + 1):
            name, home = f"{prefix}{index}", homes / f"{prefix}{index}"
            subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home),
                            "--shell", "/bin/sh", "--user-group", "--groups", group, name],
                           check=True, timeout=60, capture_output=True)
            made.append(name)
            entry = pwd.getpwnam(name)
            uids.add(entry.pw_uid)
            home.mkdir(mode=0o700)
            os.chown(home, entry.pw_uid, entry.pw_gid)
            members.append(Member(name, entry.pw_uid, entry.pw_gid, home, True))
        root_home = homes / "root"
        root_home.mkdir(mode=0o700)
        members.append(Member("root", 0, 0, root_home, False))
        yield gid, members
    finally:
        kill_processes_of(uids)
        for name in made:
            subprocess.run(["userdel", name], check=False, timeout=60, capture_output=True)
        subprocess.run(["groupdel", group], check=False, timeout=60, capture_output=True)
