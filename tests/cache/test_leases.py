"""Leases: recorded atomically, live while their holder lives, expired when it is gone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ocistage.cache.leases import (
    Holder,
    Lease,
    StagedPlace,
    acquire,
    all_leases,
    dead_leases,
    drop_own_dead,
    is_live,
    leases_on,
    leases_on_place,
    record,
    release,
    release_named,
    same_place,
    staged_groups,
    staged_identity,
)
from ocistage.errors import UsageError


def test_acquire_list_release(tmp_path: Path) -> None:
    lease = acquire(tmp_path, "bundle:abc", Holder.pin("keep"))
    assert all_leases(tmp_path) == [lease]
    assert leases_on(tmp_path, "bundle:abc") == [lease]
    assert leases_on(tmp_path, "bundle:other") == []
    assert release(tmp_path, lease.id)
    assert not release(tmp_path, lease.id)
    assert all_leases(tmp_path) == []


def test_leases_named_by_their_caller_are_released_by_prefix(tmp_path: Path) -> None:
    assert release_named(tmp_path / "absent", "job-1.") == 0
    for lease_id in ("job-1.0-a", "job-1.0-b", "job-1.1-a", "job-10.0-a"):
        record(tmp_path, Lease(lease_id, "squashfs:k", Holder.pin("p"), 1.0))
    other = acquire(tmp_path, "bundle:abc", Holder.pin("keep"))
    assert release_named(tmp_path, "job-1.0-") == 2
    assert release_named(tmp_path, "job-1.0-") == 0
    assert sorted(lease.id for lease in all_leases(tmp_path)) == sorted(
        ["job-1.1-a", "job-10.0-a", other.id])
    with pytest.raises(UsageError):
        release_named(tmp_path, "../x")


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


# -- staged places: a directory made again is another place -------------------------------------

#: mkdir calls :func:`made_with_inode` tries at most for an inode number a removal freed
INODE_ATTEMPTS = 5000


@contextmanager
def reusing_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A directory where a directory made right after one was removed gets its inode number:
    on a small ext4 filesystem of the test's own (loop-mounted; as root), where nothing else
    makes or frees inodes meanwhile; else ``tmp_path`` (where another process may take the
    number first: :func:`made_with_inode` then fails and the test skips)."""
    image, mountpoint = tmp_path / "ext4.img", tmp_path / "ext4"
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        yield tmp_path
        return
    with open(image, "wb") as out:
        out.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    mountpoint.mkdir()
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:  # no loop devices here
        yield tmp_path
        return
    try:
        yield mountpoint
    finally:
        if subprocess.run(["umount", str(mountpoint)], capture_output=True,
                          check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mountpoint)], check=True)


def made_with_inode(path: Path, ino: int) -> bool:
    """Make directory ``path`` with inode number ``ino`` (one just freed), as a filesystem
    that reuses numbers gives it (ext4 does at once): directories are made beside it until
    one gets ``ino`` (bounded), which is renamed to ``path``; the others are removed. False
    if the filesystem gave it to none."""
    tried: list[Path] = []
    try:
        for n in range(INODE_ATTEMPTS):
            candidate = path.with_name(f".try-{uuid.uuid4().hex[:8]}-{n}")
            candidate.mkdir()
            if candidate.stat().st_ino == ino:
                candidate.rename(path)
                return True
            tried.append(candidate)
        return False
    finally:
        for candidate in tried:
            candidate.rmdir()


def test_a_directory_made_again_with_the_old_inode_number_is_another_place(
        tmp_path: Path) -> None:
    with reusing_filesystem(tmp_path) as where:
        old = where / "old"
        old.mkdir()
        ino, before = old.stat().st_ino, staged_identity(old / "app")
        lease = StagedPlace.of(old / "app").acquire(tmp_path / "cache", Holder.pin("job"))
        old.rmdir()
        new = where / "new"
        if not made_with_inode(new, ino):
            pytest.skip(f"the filesystem of {where} did not give inode {ino} again")
        after = staged_identity(new / "app")
        assert before.split("/")[0].split(":")[:2] == after.split("/")[0].split(":")[:2]
        if before.count(":") < 2:
            pytest.skip(f"the filesystem of {where} has no file handles")
        assert before != after and not same_place(before, after)
        assert leases_on_place(tmp_path / "cache", StagedPlace.of(new / "app")) == []
        mine = StagedPlace.of(new / "app").acquire(tmp_path / "cache", Holder.pin("job"))
        assert sorted(map(len, staged_groups([lease, mine]))) == [1, 1]


def test_an_identity_an_earlier_release_recorded_still_counts(tmp_path: Path) -> None:
    """A lease file of the previous release records ``st_dev:st_ino/NAME`` (no file handle):
    it is on the place of that inode and name, and GC groups it with the leases there."""
    target = tmp_path / "target"
    target.mkdir()
    st = target.stat()
    old_form = f"{st.st_dev}:{st.st_ino}/app"
    (tmp_path / "cache" / "leases").mkdir(parents=True)
    (tmp_path / "cache" / "leases" / "old.json").write_text(json.dumps({
        "id": "old", "target": "staged:/elsewhere/spelled/app", "also": [], "created": 1.0,
        "identity": old_form, "holder": {"kind": "pin", "host": "h", "name": "job",
                                         "pid": None, "start": None, "job_id": None}}))
    place = StagedPlace.of(target / "app")
    assert place.identity != old_form and same_place(old_form, place.identity)
    assert not same_place(old_form, f"{st.st_dev}:{st.st_ino}/other")
    assert [lease.id for lease in leases_on_place(tmp_path / "cache", place)] == ["old"]
    new = place.acquire(tmp_path / "cache", Holder.pin("other"))
    groups = staged_groups(all_leases(tmp_path / "cache"))
    assert [sorted(lease.id for lease in group) for group in groups] == \
        [sorted(["old", new.id])]


# -- what killed processes of the caller left (drop_own_dead) ----------------------------------

def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_drop_own_dead_drops_only_the_callers_dead_processes_leases(tmp_path: Path) -> None:
    """A SIGKILLed command's ``pid`` lease stays until someone drops it; the importer's next
    command drops those of this host's dead processes, and nothing else: a live process's, a
    pin, a job's, another host's, and no file a name leads to through a symlink, a FIFO never
    waited for."""
    host = Holder.this_process().host
    dead = record_as(tmp_path, "dead", Holder("pid", host=host, pid=_dead_pid(), start="1"))
    kept = [record_as(tmp_path, "live", Holder.this_process()),
            record_as(tmp_path, "pin", Holder.pin("keep")),
            record_as(tmp_path, "job", Holder.slurm_job("7")),
            record_as(tmp_path, "elsewhere", Holder("pid", host=f"not-{host}", pid=_dead_pid(),
                                                    start="1"))]
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "x.json"
    target.write_text((tmp_path / "leases" / f"{dead.id}.json").read_text())
    (tmp_path / "leases" / "link.json").symlink_to(target)
    os.mkfifo(tmp_path / "leases" / "fifo.json")
    assert drop_own_dead(tmp_path) == 1
    assert sorted(lease.id for lease in all_leases(tmp_path)) == sorted(k.id for k in kept)
    assert target.exists() and (tmp_path / "leases" / "fifo.json").exists()
    assert drop_own_dead(tmp_path / "no-such-cache") == 0


@pytest.mark.needs_root("another user's lease file is made by chown")
def test_drop_own_dead_leaves_another_users_lease(tmp_path: Path) -> None:
    host = Holder.this_process().host
    record_as(tmp_path, "theirs", Holder("pid", host=host, pid=_dead_pid(), start="1"))
    os.chown(tmp_path / "leases" / "theirs.json", 65534, 65534)
    assert drop_own_dead(tmp_path) == 0
    assert (tmp_path / "leases" / "theirs.json").exists()


def record_as(root: Path, name: str, holder: Holder) -> Lease:
    lease = Lease(id=name, target="bundle:abc", holder=holder, created=1.0)
    record(root, lease)
    return lease
