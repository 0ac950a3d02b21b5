"""A co-tenant's FIFO (or file) in a sticky shared target, under a name ocistage reads back:
an outer marker beside a staged bundle, or beside a retired version. Opening a FIFO for
reading waits for a writer: ``cache gc`` and the next stage of the name used to hang there
for good. Now it is not ours (ocistage.cache.readback): skipped, never removed, never waited
for.

The co-tenant is a second real user (``setpriv``, uid nobody) in a ``1777`` directory; the
job is a live process holding a ``pid`` lease (as in tests/stagers/test_retired.py)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache.gc import collect
from ocistage.cache.leases import Holder
from ocistage.cache.store import Store
from ocistage.cache.targetlayout import open_staged, outer_marker_name
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.markers import hold
from ocistage.stagers.retired import retired_versions
from tests.cotenant import NOBODY, as_nobody, second_user, sticky_directory
from tests.deadline import deadline
from tests.stagers.test_retired import PIN, _end, _source, _write

pytestmark = second_user



@pytest.fixture
def sticky() -> Iterator[Path]:
    """A sticky world-writable target (as /tmp or /scratch) that nobody can reach."""
    with sticky_directory("ocistage-sticky-") as directory:
        yield directory


@pytest.fixture
def runner() -> Iterator[int]:
    process = subprocess.Popen(["sleep", "300"])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def _holder(pid: int) -> Holder:
    return Holder("pid", host=socket.gethostname(), pid=pid)


def test_a_fifo_beside_a_bundle_whose_job_ended_does_not_freeze_gc(
        tmp_path: Path, sticky: Path, runner: int) -> None:
    source, cache = _source(tmp_path / "src", "one\n"), tmp_path / "cache"
    job = _holder(runner)
    staged = stage_directory(source, sticky, cache_root=cache, name="app", holder=job)
    fifo = sticky / outer_marker_name("app")
    as_nobody("mkfifo", "-m", "666", str(fifo))
    _end(job)
    with deadline(20):
        report = collect(Store.open(cache))
    assert not os.path.lexists(staged.path)
    assert any(r.kind == "staged" and r.name == str(staged.path) for r in report.removed)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # theirs: left alone
    assert os.lstat(fifo).st_uid == NOBODY


def test_a_fifo_beside_a_retired_version_does_not_block_the_next_stage(
        tmp_path: Path, sticky: Path, runner: int) -> None:
    source, cache = _source(tmp_path / "src", "one\n"), tmp_path / "cache"
    job = _holder(runner)
    first = stage_directory(source, sticky, cache_root=cache, name="app", holder=PIN)
    hold(cache, first.path, job)
    _write(source / "rootfs" / "etc" / "version", "two\n")
    stage_directory(source, sticky, cache_root=cache, name="app", holder=PIN)
    [aside] = retired_versions(sticky, "app")
    fifo = sticky / outer_marker_name(aside.name)
    as_nobody("mkfifo", "-m", "666", str(fifo))
    _end(job)
    with deadline(20):
        again = stage_directory(source, sticky, cache_root=cache, name="app", holder=PIN)
    assert again.unchanged == again.files
    assert retired_versions(sticky, "app") == []
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_co_tenants_file_as_outer_marker_is_not_read(
        tmp_path: Path, sticky: Path, runner: int) -> None:
    """A regular file of theirs naming the job's lease would make gc treat the mounted image
    as marked: it is not read at all."""
    source, cache = _source(tmp_path / "src", "one\n"), tmp_path / "cache"
    staged = stage_directory(source, sticky, cache_root=cache, name="app",
                             holder=_holder(runner))
    outer = sticky / outer_marker_name("app")
    as_nobody("sh", "-c", f"echo '{{\"id\": \"{staged.lease_id}\"}}' > {outer}")
    bundle = open_staged(staged.path)
    assert bundle is not None
    try:
        assert bundle.outer is None
    finally:
        bundle.close()
