"""The detached remover of replaced versions (ocistage.stagers.detach, ocistage.stagers.remover,
ocistage.stagers.retired): a re-stage retires the version it replaced and returns; a remover in
a session of its own removes it. Killed at any point (SIGKILL of the remover, of its whole
session as a Slurm step's cgroup kill does), what it leaves is finished by the next stage,
unstage, ``cache gc`` or :func:`ocistage.stagers.retired.finish_retired`. Real processes, real
signals; every remover a test starts is waited for (tests/removers.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache import leases
from ocistage.cache.gc import GcOptions, collect
from ocistage.cache.leases import Holder
from ocistage.cache.store import Store
from ocistage.cache.targetlayout import MARKER_NAME, RETIRED_PREFIX, outer_marker_name
from ocistage.stagers import detach, remover
from ocistage.stagers.directory import StageResult, stage_directory
from ocistage.stagers.markers import hold
from ocistage.stagers.retired import finish_retired, is_remover, retired_versions
from ocistage.stagers.unstage import unstage
from tests.cotenant import OCISTAGE
from tests.procs import running
from tests.removers import (
    kill_session,
    remover_pids,
    session_members,
    settle,
    wait_gone,
)

PIN = Holder.pin("test")
NAME = "app"
#: files of the tree the kill tests stage: its removal takes long enough to stop it mid-way
MANY = 5_000


def no_jobs(job_ids: object) -> dict[str, str]:
    return {}


def _tree(root: Path, files: int, version: str) -> Path:
    """``files`` small files in directories of 200, and one file saying ``version``."""
    for n in range(files):
        directory = root / "rootfs" / f"d{n // 200}"
        if n % 200 == 0:
            directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{n}").write_bytes(b"%d\n" % n)
    return _version(root, version)


def _version(root: Path, version: str) -> Path:
    (root / "version").write_text(version)
    return root


def _stage(source: Path, to: Path, cache: Path) -> StageResult:
    return stage_directory(source, to, cache_root=cache, name=NAME, holder=PIN)


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tree(tmp_path_factory.mktemp("many") / "src", MANY, "one\n")


def _retired_left(to: Path, cache: Path) -> list[str]:
    """What is left of retired versions: directories, outer markers, leases."""
    names = [n for n in os.listdir(to) if RETIRED_PREFIX in n]
    held = [lease.target for lease in leases.all_leases(cache) if RETIRED_PREFIX in lease.target]
    return names + held


def _unused_pool_entries(to: Path) -> list[Path]:
    return [p for p in (to / ".ocistage-pool").rglob("*")
            if p.is_file() and p.stat().st_nlink == 1]


def _state(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {"ppid": text[1], "pgrp": text[2], "session": text[3], "nice": text[16]}


# -- the remover as a process ----------------------------------------------------------------

def test_the_remover_is_detached_niced_and_in_a_session_of_its_own() -> None:
    started = detach.spawn()
    assert started is not None
    try:
        state = _state(started.pid)
        assert state["session"] == state["pgrp"] == str(started.pid)  # setsid: its own
        assert state["ppid"] != str(os.getpid())  # nobody's child here: never our zombie
        assert state["nice"] == "19"
        for fd in (0, 1, 2):
            assert os.readlink(f"/proc/{started.pid}/fd/{fd}") == "/dev/null"
        assert os.readlink(f"/proc/{started.pid}/cwd") == "/"
        assert started.holder == Holder.process(started.pid)
    finally:
        started.cancel()  # no message: it exits doing nothing
    wait_gone(started.pid)


def test_a_remover_without_a_whole_message_does_nothing(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.write(write, b'{"cache": "/c", "path": "/t/.ocistage-retired-x.0123456789"')
    os.close(write)
    assert remover.read_message(read) is None
    os.close(read)
    lease = "remover-" + "0" * 32
    read, write = os.pipe()
    os.write(write, json.dumps({"cache": "/c", "path": "/t/.ocistage-retired-x.0123456789",
                                "lease": lease}).encode())
    os.close(write)
    assert remover.read_message(read) == remover.Message(
        Path("/c"), Path("/t/.ocistage-retired-x.0123456789"), lease)
    os.close(read)
    for bad in ({"cache": "/c", "path": "/t/x", "lease": "remover-" + "0" * 32},
                {"cache": "/c", "path": "/t/../.ocistage-retired-x.0123456789", "lease": lease},
                {"cache": "/c", "path": "t/.ocistage-retired-x", "lease": "remover-" + "0" * 32},
                {"cache": "/c", "path": "/t/.ocistage-retired-x.0123456789", "lease": "x"}):
        read, write = os.pipe()
        os.write(write, json.dumps(bad).encode())
        os.close(write)
        assert remover.read_message(read) is None, bad
        os.close(read)


# -- a re-stage ------------------------------------------------------------------------------

def test_a_restage_hands_the_replaced_version_to_a_detached_remover(tmp_path: Path) -> None:
    source, to, cache = _tree(tmp_path / "src", 3000, "one\n"), tmp_path / "to", tmp_path / "c"
    first = _stage(source, to, cache)
    _version(source, "two\n")
    second = _stage(source, to, cache)
    assert (second.path / "version").read_text() == "two\n"
    [pid] = remover_pids(cache)  # still removing: it started after the switch
    state = _state(pid)
    assert state["session"] == str(pid) and state["ppid"] != str(os.getpid())
    [lease] = [lease for lease in leases.all_leases(cache) if is_remover(lease)]
    assert lease.holder.pid == pid and RETIRED_PREFIX in lease.target
    settle(cache)
    assert _retired_left(to, cache) == []
    assert sorted(os.listdir(to)) == [".ocistage-pool", NAME]
    assert _unused_pool_entries(to) == []
    assert first.lease_id == second.lease_id


STOPS = [("midway", "session", "gc"), ("midway", "remover", "stage"),
         ("midway", "session", "unstage"), ("midway", "session", "finish"),
         ("start", "session", "gc"), ("start", "remover", "finish")]


@pytest.mark.parametrize(("when", "kill", "finisher"), STOPS)
def test_a_remover_killed_at_any_point_leaves_what_the_next_command_finishes(
        tmp_path: Path, many: Path, when: str, kill: str, finisher: str) -> None:
    """Stopped (SIGSTOP of its session) before it starts or once it is removing, then killed
    (SIGKILL of the remover alone, or of its session: a cgroup kill): the retired version is
    still there, partly removed, its marker last; the next command removes it and its lease."""
    source = tmp_path / "src"
    subprocess.run(["cp", "-a", str(many), str(source)], check=True)
    to, cache = tmp_path / "to", tmp_path / "c"
    _stage(source, to, cache)
    _version(source, "two\n")
    _stage(source, to, cache)
    [pid] = remover_pids(cache)
    [aside] = retired_versions(to, NAME)
    if when == "midway":  # it names its lease beside the version before removing anything
        outer = to / outer_marker_name(aside.name)
        end = time.monotonic() + 60
        while not outer.exists():
            assert time.monotonic() < end and running(pid), "the remover never started"
            time.sleep(0.001)
    kill_session(pid, signal.SIGSTOP)
    assert (aside / MARKER_NAME).is_file()  # removed last
    if kill == "session":
        kill_session(pid, signal.SIGKILL)
    else:
        os.kill(pid, signal.SIGKILL)
        kill_session(pid, signal.SIGCONT)  # its workers, if any, go on alone
    end = time.monotonic() + 60
    while session_members(pid):
        assert time.monotonic() < end
        time.sleep(0.005)
    assert aside.is_dir() and remover_pids(cache) == []
    if finisher == "stage":
        _stage(source, to, cache)  # unchanged: nothing new is retired
    elif finisher == "unstage":
        assert unstage(to / NAME, cache_root=cache)
    elif finisher == "gc":
        report = collect(Store.open(cache), GcOptions(), job_states=no_jobs)
        assert str(aside) in {r.name for r in report.removed if r.kind == "staged"}
    else:
        assert finish_retired(to, cache) == 1
    assert _retired_left(to, cache) == []
    assert _unused_pool_entries(to) == []
    if finisher != "unstage":
        assert (to / NAME / "version").read_text() == "two\n"


# -- concurrency ------------------------------------------------------------------------------

@pytest.fixture
def restaged(tmp_path: Path) -> Iterator[tuple[Path, Path, Path, int]]:
    """A re-stage whose remover is stopped (SIGSTOP of its session) while the test runs: the
    source, target, cache and the remover's pid; it goes on (SIGCONT) afterwards."""
    source, to, cache = _tree(tmp_path / "src", 2000, "one\n"), tmp_path / "to", tmp_path / "c"
    _stage(source, to, cache)
    _version(source, "two\n")
    _stage(source, to, cache)
    [pid] = remover_pids(cache)
    kill_session(pid, signal.SIGSTOP)
    try:
        yield source, to, cache, pid
    finally:
        kill_session(pid, signal.SIGCONT)
    settle(cache)


def test_a_stage_while_a_remover_runs_leaves_its_version_to_it(
        restaged: tuple[Path, Path, Path, int]) -> None:
    source, to, cache, pid = restaged
    [removing] = retired_versions(to, NAME)
    _version(source, "three\n")
    third = _stage(source, to, cache)
    assert (third.path / "version").read_text() == "three\n"
    assert removing in retired_versions(to, NAME)  # a live remover's: not swept here
    assert finish_retired(to, cache) == 0
    kill_session(pid, signal.SIGCONT)
    settle(cache)
    assert _retired_left(to, cache) == [] and _unused_pool_entries(to) == []


def test_unstage_while_a_remover_runs(restaged: tuple[Path, Path, Path, int]) -> None:
    _source, to, cache, pid = restaged
    assert unstage(to / NAME, cache_root=cache)
    assert len(retired_versions(to, NAME)) == 1  # left to its remover
    kill_session(pid, signal.SIGCONT)
    settle(cache)
    assert _retired_left(to, cache) == []
    assert [p for p in to.rglob("*") if not p.is_dir()] == []
    assert leases.all_leases(cache) == []


def test_two_stages_of_one_name_at_once(tmp_path: Path) -> None:
    to, cache = tmp_path / "to", tmp_path / "c"
    sources = [_tree(tmp_path / f"src{n}", 500, f"{n}\n") for n in range(2)]
    cache.mkdir(mode=0o700)  # private, as the command makes it (else it says so)
    _stage(sources[0], to, cache)
    env = {**os.environ, "OCISTAGE_CACHE": str(cache)}
    for round_ in range(3):
        started = [subprocess.Popen([OCISTAGE, "stage", str(source), "--to", str(to),
                                     "--name", NAME, "--pin", "test", "-q"], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for source in sources]
        for process in started:
            _out, err = process.communicate(timeout=300)
            assert process.returncode == 0 and err == "", err
        for n, source in enumerate(sources):
            _version(source, f"{n} after round {round_}\n")
    settle(cache)
    assert _retired_left(to, cache) == [] and _unused_pool_entries(to) == []
    assert (to / NAME / "version").read_text() in {"0 after round 1\n", "1 after round 1\n"}


def test_a_version_a_live_holder_runs_on_is_kept_not_handed_to_a_remover(
        tmp_path: Path) -> None:
    source, to, cache = _tree(tmp_path / "src", 200, "one\n"), tmp_path / "to", tmp_path / "c"
    first = _stage(source, to, cache)
    job = subprocess.Popen(["sleep", "300"])
    try:
        hold(cache, first.path, Holder("pid", socket.gethostname(), job.pid))
        _version(source, "two\n")
        _stage(source, to, cache)
        settle(cache)
        [kept] = retired_versions(to, NAME)
        assert (kept / "version").read_text() == "one\n"
        assert finish_retired(to, cache) == 0  # held
    finally:
        job.kill()
        job.wait()
    assert finish_retired(to, cache) == 1
    assert _retired_left(to, cache) == []


def test_the_remover_runs_as_a_module_of_this_interpreter() -> None:
    """What :func:`ocistage.stagers.detach.spawn` executes exists (no message: exit 0)."""
    done = subprocess.run([sys.executable, "-m", detach.REMOVER_MODULE, "0"],
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
