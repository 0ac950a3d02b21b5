"""Leases: recorded atomically, live while their holder lives, expired when it is gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ocistage.cache.errors import UsageError
from ocistage.cache.leases import (
    Holder,
    Lease,
    acquire,
    all_leases,
    dead_leases,
    is_live,
    leases_on,
    release,
)


def test_acquire_list_release(tmp_path: Path) -> None:
    lease = acquire(tmp_path, "bundle:abc", Holder.pin("keep"))
    assert all_leases(tmp_path) == [lease]
    assert leases_on(tmp_path, "bundle:abc") == [lease]
    assert leases_on(tmp_path, "bundle:other") == []
    assert release(tmp_path, lease.id)
    assert not release(tmp_path, lease.id)
    assert all_leases(tmp_path) == []


@pytest.mark.parametrize("target", ["bundle", "nope:x", "bundle:", "staged:relative/path"])
def test_invalid_targets_are_refused(tmp_path: Path, target: str) -> None:
    with pytest.raises(UsageError):
        acquire(tmp_path, target, Holder.pin("x"))


def test_a_dead_process_lease_expires(tmp_path: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c",
         f"from ocistage.cache.leases import acquire, Holder; from pathlib import Path; "
         f"print(acquire(Path({str(tmp_path)!r}), 'blob:sha256:' + 'a' * 64, "
         f"Holder.this_process()).id)"], capture_output=True, text=True, check=True)
    dead_id = child.stdout.strip()
    mine = acquire(tmp_path, "bundle:mine", Holder.this_process())
    assert [lease.id for lease in dead_leases(tmp_path)] == [dead_id]
    assert sorted(lease.id for lease in all_leases(tmp_path)) == sorted([dead_id, mine.id])


def test_pid_reuse_does_not_keep_a_lease_alive() -> None:
    me = Holder.this_process()
    reused = Holder("pid", host=me.host, pid=me.pid, start="1")  # same pid, other start time
    assert is_live(Lease("x", "bundle:k", me, 0.0), {})
    assert not is_live(Lease("x", "bundle:k", reused, 0.0), {})


def test_a_pid_on_another_host_is_kept() -> None:
    lease = Lease("x", "bundle:k", Holder("pid", host="elsewhere", pid=1, start="1"), 0.0)
    assert is_live(lease, {})


def test_slurm_job_leases_follow_the_job_state() -> None:
    lease = Lease("x", "staged:/tmp/b", Holder.slurm_job("42"), 0.0)
    assert is_live(lease, {"42": "RUNNING"})
    assert is_live(lease, {"42": "COMPLETING"})
    assert not is_live(lease, {"42": "COMPLETED"})
    assert not is_live(lease, {})          # squeue no longer lists it: ended
    assert is_live(lease, None)            # Slurm cannot be asked: keep


def test_job_states_are_asked_once_for_all_jobs(tmp_path: Path) -> None:
    acquire(tmp_path, "staged:/a", Holder.slurm_job("1"))
    acquire(tmp_path, "staged:/b", Holder.slurm_job("2"))
    calls: list[list[str]] = []

    def states(ids: object) -> dict[str, str]:
        calls.append(sorted(ids))  # type: ignore[call-overload]
        return {"1": "RUNNING"}

    assert [lease.target for lease in dead_leases(tmp_path, states)] == ["staged:/b"]
    assert calls == [["1", "2"]]


def test_invalid_job_id_is_refused() -> None:
    with pytest.raises(UsageError):
        Holder.slurm_job("12; rm -rf /")
