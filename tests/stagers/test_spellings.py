"""One staged bundle, two spellings of its path: a symlink to the target (``~/x`` and
``/gpfs/home/u/x``) or a bind mount of it. Leases follow the place, not the spelling: a
re-stage through the other spelling retires the version a job holds instead of removing it,
another job's ``unstage`` keeps the bundle while the first still runs, ``cache gc`` treats
the leases as one bundle's, and leases written before identities were recorded still count.

Jobs are live processes holding ``pid`` leases (as in tests/stagers/test_retired.py). The
bind-mount variant runs in a child process in a private mount namespace (``unshare``)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from ocistage.cache import leases
from ocistage.cache.gc import collect
from ocistage.cache.leases import Holder
from ocistage.cache.store import Store
from ocistage.cache.targetlayout import MARKER_NAME
from ocistage.cache.treeremoval import remove_tree
from ocistage.stagers.directory import StageResult, stage_directory
from ocistage.stagers.markers import Marker, hold
from ocistage.stagers.retired import retired_versions
from ocistage.stagers.unstage import unstage
from tests.cache.test_leases import made_with_inode, reusing_filesystem
from tests.stagers.test_retired import PIN, _source, _write, live_holder

Scenario = Callable[[Path, Path, Path], None]
CLONE_NEWNS = 0x00020000




def _stage(source: Path, to: Path, cache: Path, holder: Holder = PIN) -> StageResult:
    return stage_directory(source, to, cache_root=cache, name="app", holder=holder)


def restage_through_the_other_spelling(tmp: Path, spelled: Path, real: Path) -> None:
    source, cache = _source(tmp / "src", "one\n"), tmp / "cache"
    first = _stage(source, spelled, cache)
    with live_holder() as runner:
        hold(cache, first.path, runner)  # the job was given the path it was staged at
        inside = os.open(first.path / "rootfs" / "etc", os.O_RDONLY)
        try:
            _write(source / "rootfs" / "etc" / "version", "two\n")
            second = _stage(source, real, cache)
            assert (second.path / "rootfs" / "etc" / "version").read_text() == "two\n"
            [aside] = retired_versions(real, "app")
            assert os.open("version", os.O_RDONLY, dir_fd=inside) >= 0  # still there for it
            assert (aside / "rootfs" / "etc" / "version").read_text() == "one\n"
        finally:
            os.close(inside)


def unstage_through_the_other_spelling(tmp: Path, spelled: Path, real: Path) -> None:
    source, cache = _source(tmp / "src", "one\n"), tmp / "cache"
    with live_holder() as first, live_holder() as second:
        staged = _stage(source, spelled, cache, holder=first)
        _stage(source, real, cache, holder=second)
        assert unstage(real / "app", cache_root=cache, holder=second) is False
        assert (staged.path / "rootfs" / "etc" / "version").read_text() == "one\n"
        # the first job's own unstage, through its spelling, removes it
        assert unstage(staged.path, cache_root=cache, holder=first) is True
    assert not os.path.lexists(real / "app")


def gc_sees_one_bundle(tmp: Path, spelled: Path, real: Path) -> None:
    """The marker names the lease of the job that staged through the real path; that job
    ends while the one that staged through the other spelling runs."""
    source, cache = _source(tmp / "src", "one\n"), tmp / "cache"
    with live_holder() as first:
        _stage(source, spelled, cache, holder=first)
        with live_holder() as second:
            _write(source / "rootfs" / "etc" / "version", "two\n")
            result = _stage(source, real, cache, holder=second)
            assert Marker.from_json((real / "app" / MARKER_NAME).read_bytes()).id == \
                result.lease_id
        collect(Store.open(cache))
        assert (real / "app" / "rootfs" / "etc" / "version").read_text() == "two\n"
    collect(Store.open(cache))  # both ended: now it goes
    assert not os.path.lexists(real / "app")


def leases_of_the_previous_format_count(tmp: Path, spelled: Path, real: Path) -> None:
    """A lease file written before identities were recorded (no "identity" key): a job's
    lease taken through the other spelling is honoured after an upgrade."""
    source, cache = _source(tmp / "src", "one\n"), tmp / "cache"
    first = _stage(source, spelled, cache)
    with live_holder() as runner:
        old = leases.acquire(cache, f"staged:{first.path}", runner)  # as ocistage did
        text = (cache / "leases" / f"{old.id}.json").read_text()
        assert "identity" not in json.loads(text)
        _write(source / "rootfs" / "etc" / "version", "two\n")
        _stage(source, real, cache)
        [aside] = retired_versions(real, "app")
        assert (aside / "rootfs" / "etc" / "version").read_text() == "one\n"


SCENARIOS = [restage_through_the_other_spelling, unstage_through_the_other_spelling,
             gc_sees_one_bundle, leases_of_the_previous_format_count]


def _in_mount_namespace(scenario: Scenario, tmp: Path, bind: Path, real: Path) -> None:
    """Run ``scenario`` in a forked child in a private mount namespace where ``bind`` is a
    bind mount of ``real`` (gone with the child)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read_fd)
        status = 1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNS) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
            subprocess.run(["mount", "--make-rprivate", "/"], check=True)
            subprocess.run(["mount", "--bind", str(real), str(bind)], check=True)
            assert os.path.samestat(os.stat(bind), os.stat(real))
            scenario(tmp, bind, real)
            status = 0
        except BaseException:
            os.write(write_fd, traceback.format_exc().encode())
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        report = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, report


def _can_bind_mount() -> str | None:
    """Why a bind mount in a private namespace cannot be made here, or None."""
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True, check=False)
    return None if probe.returncode == 0 else f"unshare -m fails here: {probe.stderr!r}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_through_a_symlink(tmp_path: Path, scenario: Scenario) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    scenario(tmp_path, link, real)


@pytest.mark.needs_root("mount --bind")
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_through_a_bind_mount(tmp_path: Path, scenario: Scenario) -> None:
    reason = _can_bind_mount()
    if reason is not None:
        pytest.skip(reason)
    real, bind = tmp_path / "real", tmp_path / "bind"
    real.mkdir()
    bind.mkdir()
    _in_mount_namespace(scenario, tmp_path, bind, real)


def test_a_target_made_again_with_the_old_inode_number_is_another_place(
        tmp_path: Path) -> None:
    """A job stages into a directory, which is removed (the version with it); a new one gets
    the old inode number (ext4 gives it at once) and the job stages into that: the version
    there is removed by GC once the job has ended (it kept its first lease, which the new
    version's marker named, and GC found nothing at that lease's path)."""
    source, cache = _source(tmp_path / "src", "one\n"), tmp_path / "cache"
    with reusing_filesystem(tmp_path) as where:
        old, new = where / "targets" / "old", where / "targets" / "new"
        old.mkdir(parents=True)
        with live_holder() as job:
            _stage(source, old, cache, holder=job)
            ino = old.stat().st_ino
            remove_tree(old)
            if not made_with_inode(new, ino):
                pytest.skip(f"the filesystem of {where} did not give inode {ino} again")
            again = _stage(source, new, cache, holder=job)
            [lease] = [lease for lease in leases.all_leases(cache)
                       if lease.id == again.lease_id]
            collect(Store.open(cache))
            assert (new / "app" / "rootfs" / "etc" / "version").read_text() == "one\n"
        collect(Store.open(cache))  # the job has ended
        assert not os.path.lexists(new / "app")
    assert leases.all_leases(cache) == []
    assert lease.target == f"staged:{new / 'app'}"  # what the marker named: a new lease
