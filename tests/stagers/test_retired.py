"""ocistage.stagers.retired: a re-stage keeps the replaced version while a live holder other than
the
stager may run on it, and removes it once that holder is gone (next stage, unstage, cache gc).

A live holder here is a process (a ``pid`` lease of a ``sleep`` this test starts), which
:func:`ocistage.cache.leases.is_live` checks without Slurm; tests/e2e/test_slurm.py runs the same
with a real Slurm job reading the bundle in its container.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ocistage.cache import leases
from ocistage.cache.gc import GcOptions, collect
from ocistage.cache.leases import Holder
from ocistage.cache.store import Store
from ocistage.cache.targetlayout import MARKER_NAME, RETIRED_PREFIX
from ocistage.errors import UsageError
from ocistage.stagers import retired
from ocistage.stagers.directory import StageResult, stage_directory
from ocistage.stagers.errors import StageError
from ocistage.stagers.markers import Marker, hold
from ocistage.stagers.retired import retired_versions
from ocistage.stagers.target import MAX_NAME
from ocistage.stagers.unstage import unstage
from pytest_ocistage.components import require_binary, require_root
from tests.bundler.clirun import Cli, cli
from tests.removers import settle

__all__ = ["cli"]  # the fixture

PIN = Holder.pin("test")


@contextmanager
def live_holder() -> Iterator[Holder]:
    """A live process standing for a job's container, as a lease holder."""
    process = subprocess.Popen(["sleep", "300"])
    try:
        yield Holder("pid", host=socket.gethostname(), pid=process.pid)
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def runner() -> Iterator[Holder]:
    with live_holder() as holder:
        yield holder


def _end(holder: Holder) -> None:
    assert holder.pid is not None
    os.kill(holder.pid, 9)
    os.waitpid(holder.pid, 0)


def _source(root: Path, version: str) -> Path:
    (root / "rootfs" / "etc").mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"root": {"path": "rootfs"}}\n')
    for n in range(20):
        (root / "rootfs" / f"f{n}").write_text(f"file {n}\n")
    _write(root / "rootfs" / "etc" / "version", version)
    return root


def _write(path: Path, text: str) -> None:
    """A new inode (as an editor or a build writes): hardlinked versions keep the old one."""
    temp = path.with_name(path.name + ".new")
    temp.write_text(text)
    os.replace(temp, path)


def _stage(source: Path, to: Path, cache: Path, holder: Holder = PIN,
           **options: object) -> StageResult:
    return stage_directory(source, to, cache_root=cache, name="app", holder=holder,
                           **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("link", [None, False])
def test_a_running_holder_keeps_the_replaced_version(tmp_path: Path, runner: Holder,
                                                     link: bool | None) -> None:
    source, to, cache = _source(tmp_path / "src", "one\n"), tmp_path / "to", tmp_path / "cache"
    first = _stage(source, to, cache, link=link)
    hold(cache, first.path, runner)  # a job that runs it
    inside = os.open(first.path / "rootfs" / "etc", os.O_RDONLY)  # as a container's mount
    try:
        _write(source / "rootfs" / "etc" / "version", "two\n")
        second = _stage(source, to, cache, link=link)
        assert (second.path / "rootfs" / "etc" / "version").read_text() == "two\n"
        assert os.open("version", os.O_RDONLY, dir_fd=inside) >= 0  # still there for it
        [aside] = retired_versions(to, "app")
        assert aside.name.startswith(RETIRED_PREFIX + "app.")
        assert (aside / "rootfs" / "etc" / "version").read_text() == "one\n"
        assert os.path.samestat(os.fstat(inside), os.stat(aside / "rootfs" / "etc"))
        # held by the runner alone, and marked with that lease (cache gc's contract)
        [lease] = leases.leases_on(cache, f"staged:{aside}")
        assert lease.holder == runner
        assert Marker.from_json((aside / MARKER_NAME).read_bytes()).id == lease.id
        if link is False:  # a copy carries nothing over from a version a job may write to
            assert (second.path / "rootfs" / "f0").stat().st_ino != \
                (aside / "rootfs" / "f0").stat().st_ino
        # while it runs, another change retires the second version too
        _write(source / "rootfs" / "etc" / "version", "three\n")
        _stage(source, to, cache, link=link)
        assert len(retired_versions(to, "app")) == 2
        _end(runner)
        again = _stage(source, to, cache, link=link)  # unchanged: the next stage sweeps
        assert again.unchanged == again.files
        assert retired_versions(to, "app") == []
        assert not [lease for lease in leases.all_leases(cache) if lease.holder == runner
                    and RETIRED_PREFIX in lease.target]
    finally:
        os.close(inside)


def test_pins_and_the_stager_itself_do_not_retire(tmp_path: Path) -> None:
    """A pin names no running process (it is held until unstage), and a holder that takes
    its lease with this very stage was not running on the replaced version."""
    source, to, cache = _source(tmp_path / "src", "one\n"), tmp_path / "to", tmp_path / "cache"
    first = _stage(source, to, cache)
    hold(cache, first.path, Holder.pin("another"))
    _write(source / "rootfs" / "etc" / "version", "two\n")
    _stage(source, to, cache, holder=Holder("pid", socket.gethostname(), os.getpid()))
    settle(cache)  # not kept: removed by its remover
    assert retired_versions(to, "app") == []


def _retired_once(tmp_path: Path, to: Path, runner: Holder) -> tuple[Path, Path, Path]:
    """Stage, let ``runner`` hold the bundle, change the source and stage again: the staged
    path, the cache and the one retired version."""
    source, cache = _source(tmp_path / "src", "one\n"), tmp_path / "cache"
    first = _stage(source, to, cache)
    hold(cache, first.path, runner)
    _write(source / "rootfs" / "etc" / "version", "two\n")
    _stage(source, to, cache)
    [aside] = retired_versions(to, "app")
    return first.path, cache, aside


def test_unstage_releases_the_callers_leases_on_retired_versions(tmp_path: Path,
                                                                 runner: Holder) -> None:
    to = tmp_path / "to"
    staged, cache, aside = _retired_once(tmp_path, to, runner)
    # another holder's unstage: the runner still uses both the bundle and the retired version
    assert unstage(staged, cache_root=cache, holder=PIN) is False
    assert retired_versions(to, "app") == [aside]
    # the runner's own unstage (as a job's cleanup): both go
    assert unstage(staged, cache_root=cache, holder=runner) is True
    assert retired_versions(to, "app") == []
    assert not to.joinpath(".ocistage-pool").exists() or not any(
        p.is_file() for p in to.joinpath(".ocistage-pool").rglob("*"))


def test_unstage_force_removes_retired_versions_whoever_holds_them(tmp_path: Path,
                                                                   runner: Holder) -> None:
    to = tmp_path / "to"
    staged, cache, _aside = _retired_once(tmp_path, to, runner)
    assert unstage(staged, cache_root=cache, holder=PIN, force=True) is True
    assert retired_versions(to, "app") == []
    assert [lease for lease in leases.all_leases(cache) if RETIRED_PREFIX in lease.target] == []


def test_cache_gc_removes_a_retired_version_once_its_holders_are_gone(
        tmp_path: Path, other_fs: Path, runner: Holder) -> None:
    """Nobody stages the name again: ``cache gc`` finds the retired version by its leases,
    and the pool entries only it linked go with it."""
    _staged, cache, aside = _retired_once(tmp_path, other_fs, runner)
    assert (other_fs / ".ocistage-pool").is_dir()  # staged through the pool
    pooled = {p.name for p in (other_fs / ".ocistage-pool").rglob("*") if p.is_file()}
    assert len(pooled) == 22  # 20 files, config.json, and both versions of etc/version
    collect(Store.open(cache), GcOptions())
    assert aside.exists()  # its holder runs
    _end(runner)
    report = collect(Store.open(cache), GcOptions())
    assert not aside.exists()
    assert [r.name for r in report.removed if r.kind == "staged"] == [str(aside)]
    pooled = {p.name for p in (other_fs / ".ocistage-pool").rglob("*") if p.is_file()}
    assert len(pooled) == 21
    assert (other_fs / "app" / "rootfs" / "etc" / "version").read_text() == "two\n"


def test_a_retired_version_that_cannot_be_removed_does_not_stop_staging(
        tmp_path: Path, runner: Holder) -> None:
    """A file in a retired version that may not be removed (immutable here; a file a job made
    that is not ours, on a cluster): the next stage of the name still works, the version and
    its leases stay, and a later sweep removes it once it can."""
    require_root()  # an immutable file (chattr +i)
    chattr = require_binary("chattr", "e2fsprogs")
    to = tmp_path / "to"
    _staged, cache, aside = _retired_once(tmp_path, to, runner)
    stuck = aside / "rootfs" / "stuck"
    stuck.write_text("x")
    if subprocess.run([chattr, "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem has no immutable flag")
    try:
        _end(runner)
        source = tmp_path / "src"
        _write(source / "rootfs" / "etc" / "version", "three\n")
        third = _stage(source, to, cache)
        assert (third.path / "rootfs" / "etc" / "version").read_text() == "three\n"
        settle(cache)  # the version the third stage replaced: removed by its remover
        assert retired_versions(to, "app") == [aside]
        assert (aside / MARKER_NAME).is_file()  # removed last: gc still knows it
        assert leases.leases_on(cache, f"staged:{aside}") != []
    finally:
        subprocess.run([chattr, "-i", str(stuck)], check=True)
    _stage(source, to, cache)
    assert retired_versions(to, "app") == []


def test_the_longest_name_is_retired_and_one_more_byte_is_a_usage_error(
        tmp_path: Path, runner: Holder, cli: Cli) -> None:
    """A retired version's name is NAME + 29 bytes (the outer marker's temp file NAME + 35):
    a name whose derived names would not fit used to be staged, and then a re-stage under a
    live job published the new version, deleted the one the job held and failed with
    ENAMETOOLONG. Such a name is refused up front, as bad input (exit 2)."""
    source, to, cache = _source(tmp_path / "src", "one\n"), tmp_path / "to", tmp_path / "cache"
    longest = "n" * MAX_NAME
    first = stage_directory(source, to, cache_root=cache, name=longest, holder=PIN)
    hold(cache, first.path, runner)
    _write(source / "rootfs" / "etc" / "version", "two\n")
    stage_directory(source, to, cache_root=cache, name=longest, holder=PIN)
    [aside] = retired_versions(to, longest)
    assert (aside / "rootfs" / "etc" / "version").read_text() == "one\n"
    for length in (MAX_NAME + 1, 231):
        with pytest.raises(UsageError) as refused:
            stage_directory(source, to, cache_root=cache, name="n" * length, holder=PIN)
        assert refused.value.exit_code == 2 and str(MAX_NAME) in (refused.value.hint or "")
        assert not os.path.lexists(to / ("n" * length))
    outcome = cli("stage", str(source), "--to", str(to), "--name", "m" * (MAX_NAME + 1))
    assert outcome.returncode == 2 and f"at most {MAX_NAME} bytes" in outcome.stderr


def test_a_replaced_version_that_cannot_be_retired_is_never_dropped(
        tmp_path: Path, runner: Holder, monkeypatch: pytest.MonkeyPatch) -> None:
    source, to, cache = _source(tmp_path / "src", "one\n"), tmp_path / "to", tmp_path / "cache"
    first = _stage(source, to, cache)
    hold(cache, first.path, runner)
    inside = os.open(first.path / "rootfs" / "etc", os.O_RDONLY)
    try:
        def fail(*args: object) -> Path:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(retired, "retire", fail)
        _write(source / "rootfs" / "etc" / "version", "two\n")
        with pytest.raises(StageError, match="no space left"):
            _stage(source, to, cache)
        # the job's version is where the failed stage left it, whole
        with os.fdopen(os.open("version", os.O_RDONLY, dir_fd=inside)) as version:
            assert version.read() == "one\n"
        assert len(os.listdir(inside)) == 1
    finally:
        os.close(inside)
