"""Staging and ``cache gc`` together: GC collects what stagers made once its leases are dead
(squashfs mounts unmounted, pool entries swept, images fetched from a URL too), and a stager
never looks at a staged path while a GC runs."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from ocistage.cache import leases, targetlayout, usage
from ocistage.cache.gc import GcOptions, GcReport, collect
from ocistage.cache.leases import Holder
from ocistage.cache.store import Store
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.errors import StageError
from ocistage.stagers.remote import push_tree, stage_from_url
from ocistage.stagers.target import StageResult
from ocistage.stagers.unstage import unstage
from tests.cache.gclock import GcChecks, gc_lock_held
from tests.stagers.conftest import make_tree, require_fuse_mount

DEAD_JOB = Holder.slurm_job("424242")


def no_jobs(job_ids: object) -> dict[str, str]:
    """squeue's answer when none of the jobs is running any more."""
    return {}


def gc(cache: Path) -> GcReport:
    return collect(Store.open(cache), GcOptions(), job_states=no_jobs)


def staged_removed(report: GcReport) -> set[str]:
    return {r.name for r in report.removed if r.kind == "staged"}


def require_mount() -> None:
    require_fuse_mount()


def test_gc_unmounts_and_removes_a_mounted_image_of_a_dead_job(tree: Path,
                                                                tmp_path: Path) -> None:
    require_mount()
    cache, target = tmp_path / "cache", tmp_path / "t"
    result = stage_directory(tree, target, cache_root=cache, format="squashfs",
                             squashfs_mount=True, holder=DEAD_JOB)
    try:
        assert result.method == "squashfs-mount" and os.path.ismount(result.path)
        report = gc(cache)
    finally:
        if os.path.ismount(result.path):
            targetlayout.unmount(result.path)
    assert staged_removed(report) == {str(result.path)}
    assert not os.path.lexists(result.path)
    assert sorted(os.listdir(target)) == []  # the image went too (and no scratch dir stays)
    assert leases.all_leases(cache) == []
    assert (tree / "config.json").exists()  # the source is untouched


def test_gc_keeps_a_mounted_image_while_a_lease_lives(tree: Path, tmp_path: Path) -> None:
    require_mount()
    cache = tmp_path / "cache"
    result = stage_directory(tree, tmp_path / "t", cache_root=cache, format="squashfs",
                             squashfs_mount=True, holder=DEAD_JOB)
    try:
        stage_directory(tree, tmp_path / "t", cache_root=cache, format="squashfs",
                        holder=Holder.pin("other"))
        assert staged_removed(gc(cache)) == set()
        assert os.path.ismount(result.path)
    finally:
        targetlayout.unmount(result.path)


def test_gc_collects_an_image_fetched_from_a_url_once_its_lease_is_dead(
        tree: Path, tmp_path: Path) -> None:
    require_mount()
    cache, target = tmp_path / "cache", tmp_path / "t"
    work = tmp_path / "work"
    work.mkdir()
    pushed = push_tree(tree, f"file://{tmp_path / 'remote'}", "img", format="squashfs",
                       work=work, label="test")
    result = stage_from_url(pushed.url, target, cache_root=cache, holder=DEAD_JOB,
                            mount_image=True)
    try:
        assert result.method == "squashfs-mount"
        outer = target / targetlayout.outer_marker_name("img")
        assert f'"id": "{result.lease_id}"' in outer.read_text()
        report = gc(cache)
    finally:
        if os.path.ismount(result.path):
            targetlayout.unmount(result.path)
    assert staged_removed(report) == {str(result.path)}
    assert sorted(os.listdir(target)) == []
    assert (tmp_path / "remote" / "img.sqfs").is_file()  # the remote copy stays


def test_gc_removes_a_dead_pool_bundle_and_sweeps_what_only_it_used(
        tmp_path: Path, other_fs: Path) -> None:
    cache = tmp_path / "cache"
    dead_src = make_tree(tmp_path / "dead", files=30, seed=1)
    live_src = make_tree(tmp_path / "live", files=30, seed=1)
    for n in range(10):  # the first ten files differ between the two trees
        (dead_src / "rootfs" / "bin" / f"f{n}").write_text(f"only in dead {n}\n")
    outside = other_fs / "user-file"
    outside.write_text("not ocistage's\n")
    dead = stage_directory(dead_src, other_fs, cache_root=cache, holder=DEAD_JOB)
    live = stage_directory(live_src, other_fs, cache_root=cache, holder=Holder.pin("keep"))
    assert dead.method == live.method == "pool"
    pool = other_fs / targetlayout.POOL_DIR
    before = {p.name for p in pool.glob("*/*")}
    report = gc(cache)
    assert staged_removed(report) == {str(dead.path)}
    assert not dead.path.exists()
    after = {p.name for p in pool.glob("*/*")}
    assert len(before - after) == 10  # exactly the contents only the dead bundle used
    assert all(p.stat().st_nlink > 1 for p in pool.glob("*/*"))
    for n in range(30):
        assert (live.path / "rootfs" / "bin" / f"f{n}").read_bytes() == \
            (live_src / "rootfs" / "bin" / f"f{n}").read_bytes()
    assert outside.read_text() == "not ocistage's\n"
    assert sorted(os.listdir(other_fs)) == sorted(
        [".ocistage-pool", "live", "user-file"])


def test_a_stager_waits_for_a_running_gc_before_looking(tree: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage records its lease, then waits while a GC runs, and stages once it has ended:
    seen as the lease on disk and no bundle while the stager finds the GC running again and
    again, and the bundle staged within a deadline of the GC's end."""
    cache = tmp_path / "cache"
    Store.open(cache)
    checks = GcChecks(monkeypatch)
    with gc_lock_held(cache) as release:
        done = threading.Event()

        def stage() -> None:
            stage_directory(tree, tmp_path / "t", cache_root=cache, holder=Holder.pin("p"))
            done.set()

        thread = threading.Thread(target=stage)
        thread.start()
        checks.wait_until_waiting()
        assert not done.is_set()
        assert not (tmp_path / "t" / "bundle").exists()
        assert [lease.target for lease in leases.all_leases(cache)] == [
            f"staged:{tmp_path / 't' / 'bundle'}"]
        release()
        assert done.wait(30), "the stage did not finish within 30 s of the GC's end"
        thread.join(timeout=30)
        assert checks.answers[-1] is False
        assert (tmp_path / "t" / "bundle" / "config.json").exists()


def test_staging_a_cached_bundle_records_its_use(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    key = "ab" * 16
    source = make_tree(cache / "bundles" / key)
    assert usage.last_used(cache, "bundle", key) is None
    stage_directory(source, tmp_path / "t", cache_root=cache, holder=Holder.pin("p"))
    first = usage.last_used(cache, "bundle", key)
    assert first is not None
    os.utime(usage.usage_path(cache, "bundle", key), (1, 1))
    stage_directory(source, tmp_path / "t", cache_root=cache, holder=Holder.pin("p"))
    again = usage.last_used(cache, "bundle", key)
    assert again is not None and again > 1  # an unchanged re-stage is a use too


def test_a_failed_stage_leaves_no_lease(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (tmp_path / "t" / "bundle").mkdir(parents=True)  # not staged by ocistage
    with pytest.raises(StageError, match="not staged by ocistage"):
        stage_directory(tree, tmp_path / "t", cache_root=cache, holder=Holder.pin("p"))
    assert leases.all_leases(cache) == []
    done = stage_directory(tree, tmp_path / "t", cache_root=cache, name="b2",
                           holder=Holder.pin("p"))
    assert [lease.id for lease in leases.all_leases(cache)] == [done.lease_id]


@pytest.mark.parametrize("fmt", ["dir", "squashfs"])
def test_unstage_by_the_first_holder_hands_the_marker_to_a_remaining_lease(
        tree: Path, tmp_path: Path, fmt: str) -> None:
    """The marker names the first stager's lease; when that holder unstages while another
    still uses the bundle, GC must still be able to collect it once that one is gone too."""
    if fmt == "squashfs":
        require_mount()
    cache, target = tmp_path / "cache", tmp_path / "t"
    other = subprocess.Popen(["sleep", "60"])
    other_holder = Holder("pid", host=socket.gethostname(), pid=other.pid)
    try:
        first = stage_directory(tree, target, cache_root=cache, holder=Holder.pin("first"),
                                format="squashfs" if fmt == "squashfs" else "dir",
                                squashfs_mount=True if fmt == "squashfs" else None)
        again = stage_directory(tree, target, cache_root=cache, holder=other_holder,
                                format="squashfs" if fmt == "squashfs" else "dir")
        assert again.path == first.path and again.lease_id != first.lease_id
        assert not unstage(first.path, cache_root=cache, holder=Holder.pin("first"))
        assert first.path.exists()  # kept for the other, live holder
        assert staged_removed(gc(cache)) == set()
    finally:
        other.kill()
        other.wait()
    try:
        report = gc(cache)  # the other holder is gone now
    finally:
        if os.path.ismount(first.path):
            targetlayout.unmount(first.path)
    assert staged_removed(report) == {str(first.path)}
    # a tree of the user's is staged through the pool (issue 27.7): emptied with the bundle
    assert sorted(os.listdir(target)) in ([], [".ocistage-pool"])
    assert not [p for p in (target / ".ocistage-pool").rglob("*") if p.is_file()]
    assert leases.all_leases(cache) == []


def _unstage_killed_at(path: Path, cache: Path, step: str, by: str = "unstage") -> None:
    """Run ``unstage(path)`` (``by`` "gc": a ``cache gc``) in a forked child that dies
    (``_exit``, as a SIGKILL would leave it: no cleanup) right after ``step``: "unmount"
    (the image is unmounted, its marker gone with it) or "take-down" (the tree is gone, the
    image and markers beside it not)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            if step == "unmount":
                real = targetlayout.unmount

                def unmount_then_die(mountpoint: Path, *, lazy: bool = False) -> None:
                    real(mountpoint, lazy=lazy)
                    os._exit(9)

                targetlayout.unmount = unmount_then_die  # type: ignore[assignment]
            else:
                def die(bundle: object) -> None:
                    os._exit(9)

                targetlayout.remove_beside = die  # type: ignore[assignment]
            if by == "gc":
                gc(cache)
            else:
                unstage(path, cache_root=cache)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9


def _staged_then_cut_short(tree: Path, target: Path, cache: Path, fmt: str, step: str,
                           holder: Holder, by: str = "unstage") -> StageResult:
    """Stage ``tree`` as ``fmt`` ("squashfs": a mounted image; "dir"), then kill the
    ``unstage`` (or ``cache gc``, ``by``) of it right after ``step``; never leaves a mount."""
    result = stage_directory(tree, target, cache_root=cache, holder=holder,
                             format="squashfs" if fmt == "squashfs" else "dir",
                             squashfs_mount=True if fmt == "squashfs" else None)
    try:
        _unstage_killed_at(result.path, cache, step, by=by)
    finally:
        if os.path.ismount(result.path):
            targetlayout.unmount(result.path)
    return result


@pytest.mark.parametrize(("fmt", "step"), [("squashfs", "unmount"), ("squashfs", "take-down"),
                                           ("dir", "take-down")])
@pytest.mark.parametrize("finisher", ["unstage", "gc"])
def test_an_unstage_killed_half_way_is_finished_by_unstage_or_gc(
        tree: Path, tmp_path: Path, fmt: str, step: str, finisher: str) -> None:
    """Issue 27.10: unstage killed right after unmounting a squashfs left ``NAME/`` and
    ``NAME.sqfs`` that neither unstage ("not staged by ocistage") nor gc removed."""
    if fmt == "squashfs":
        require_mount()
    cache, target = tmp_path / "cache", tmp_path / "t"
    result = _staged_then_cut_short(tree, target, cache, fmt, step, Holder.pin("p"))
    assert result.method == ("squashfs-mount" if fmt == "squashfs" else "pool")
    left = sorted(os.listdir(target))
    assert [n for n in left if not n.startswith(".ocistage")] != []  # something was left
    if finisher == "unstage":
        assert unstage(result.path, cache_root=cache)
    else:
        assert staged_removed(gc(cache)) == {str(result.path)}
    assert [n for n in os.listdir(target) if not n.startswith(".ocistage")] == []
    assert not [p for p in (target / ".ocistage-pool").rglob("*") if p.is_file()]
    assert leases.all_leases(cache) == []


@pytest.mark.parametrize("finisher", ["unstage", "gc"])
def test_a_gc_killed_after_unmounting_is_finished(tree: Path, tmp_path: Path,
                                                   finisher: str) -> None:
    """The same for ``cache gc`` removing a mounted image of a dead job: its dead lease stays
    until the removal is done, and the outer marker names it."""
    require_mount()
    cache, target = tmp_path / "cache", tmp_path / "t"
    result = _staged_then_cut_short(tree, target, cache, "squashfs", "unmount", DEAD_JOB,
                                    by="gc")
    assert sorted(os.listdir(target)) == [".bundle.ocistage-staged.json", "bundle",
                                          "bundle.sqfs"]
    if finisher == "unstage":
        assert unstage(result.path, cache_root=cache)
    else:
        assert staged_removed(gc(cache)) == {str(result.path)}
    assert sorted(os.listdir(target)) == []
    assert leases.all_leases(cache) == []


@pytest.mark.parametrize(("fmt", "step"), [("squashfs", "unmount"), ("dir", "take-down")])
def test_a_stage_after_an_unstage_cut_short_finishes_it(tree: Path, tmp_path: Path, fmt: str,
                                                         step: str) -> None:
    """Staging the name again (as a directory) finishes what the killed unstage left, and
    leaves no outer marker naming its dead lease beside the new bundle."""
    if fmt == "squashfs":
        require_mount()
    cache, target = tmp_path / "cache", tmp_path / "t"
    _staged_then_cut_short(tree, target, cache, fmt, step, Holder.pin("p"))
    assert os.path.lexists(target / targetlayout.outer_marker_name("bundle"))
    again = stage_directory(tree, target, cache_root=cache, holder=Holder.pin("p"))
    assert sorted(os.listdir(target)) == [".ocistage-pool", "bundle"]
    assert [lease.id for lease in leases.all_leases(cache)] == [again.lease_id]
