"""Forked workers for many small file operations: results in order, errors re-raised, and a
first stage of thousands of files through them equal to the source."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import xxhash

from ocistage.cache.leases import Holder
from ocistage.stagers import builder as builder_module
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.filemanifest import MANIFEST_NAME, load_manifest
from ocistage.stagers.parallel import (
    MAX_QUEUE,
    batches,
    map_parts,
    map_queue,
    queue_in_two_steps,
)
from tests.removers import settle


def _squares_in_child(part: Sequence[int]) -> list[tuple[int, int]]:
    return [(n * n, os.getpid()) for n in part]


def test_results_come_back_in_order_from_several_processes() -> None:
    results = map_parts(_squares_in_child, list(range(500)), 3)
    assert [r for r, _pid in results] == [n * n for n in range(500)]
    assert len({pid for _r, pid in results}) == 3
    assert os.getpid() in {pid for _r, pid in results}  # the caller does a share too


def _fail_on_400(n: int) -> int:
    if n == 400:
        raise FileNotFoundError(errno.ENOENT, "gone", f"/x/{n}")
    return n


def _fail_on_400_in_child(part: Sequence[int]) -> list[int]:
    return [_fail_on_400(n) for n in part]


def test_an_error_in_a_child_is_raised_in_the_caller() -> None:
    with pytest.raises(FileNotFoundError) as info:
        map_parts(_fail_on_400_in_child, list(range(500)), 2)
    assert info.value.filename == "/x/400" and info.value.errno == errno.ENOENT


def test_batches_are_contiguous_and_cover_everything() -> None:
    items = list(range(1000))
    parts = batches(items, lambda n: n, 4)
    assert len(parts) == 4 and [n for part in parts for n in part] == items


def test_a_first_stage_of_thousands_of_files_through_forked_workers(
        tmp_path: Path, other_fs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ocistage.stagers import fresh

    monkeypatch.setattr(fresh, "FORK_MIN_FILES", 100)  # the first stage's queue of runs
    monkeypatch.setattr("ocistage.stagers.directory.usable_cpus", lambda: 2)
    queued: list[tuple[int, int]] = []

    def spy(function: Any, tasks: Sequence[Any], processes: int) -> list[Any]:
        queued.append((len(tasks), processes))
        return map_queue(function, tasks, processes)

    monkeypatch.setattr(fresh, "map_queue", spy)
    source = tmp_path / "src"
    for n in range(600):
        directory = source / f"d{n % 7}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{n}").write_bytes(b"%d " % (n % 450) * (n % 50 + 1))  # duplicates
        os.chmod(directory / f"f{n}", 0o644 if n % 3 else 0o755)
    big = source / "big"
    big.write_bytes(os.urandom(3 << 20))  # more than one read chunk
    result = stage_directory(source, other_fs, cache_root=tmp_path / "cache",
                             holder=Holder.pin("t"), jobs=4)
    assert result.method == "pool" and result.files == 601
    assert result.copied + result.linked == 601 and result.linked > 0  # equal contents pooled
    manifest = load_manifest(result.path / MANIFEST_NAME)
    assert manifest is not None
    for path, kind, mode, _size, _mtime, _dev, _ino, digest, *_rest in manifest.entries:
        if kind != "file":
            continue
        staged = result.path / path
        data = staged.read_bytes()
        assert data == (source / path).read_bytes()
        assert digest == xxhash.xxh3_128(data).hexdigest()
        assert staged.stat().st_mode & 0o7777 == mode == (source / path).stat().st_mode & 0o7777
        links = staged.stat().st_nlink
        assert links >= 2  # the bundle's name and the pool's (and equal files elsewhere)
        if links == 2:  # a pooled file keeps the mtime of its first copy
            assert staged.stat().st_mtime_ns == (source / path).stat().st_mtime_ns
    assert queued == [(10, 2)]  # 601 files in runs of 64, two processes
    twins = {p.name for p in other_fs.rglob("*.ocistage-twin")}
    assert twins == set()
    again = stage_directory(source, other_fs, cache_root=tmp_path / "cache",
                            holder=Holder.pin("t"), jobs=4)
    assert again.unchanged == again.files


def _slice_in_child(part: Sequence[int]) -> list[tuple[int, int, int]]:
    first = part[0]  # state kept across one slice: its first item
    return [(n, first, os.getpid()) for n in part]


def test_map_parts_hands_each_process_one_contiguous_slice() -> None:
    results = map_parts(_slice_in_child, list(range(300)), 3)
    assert [n for n, _first, _pid in results] == list(range(300))
    slices: dict[int, list[int]] = {}
    for n, first, _pid in results:
        slices.setdefault(first, []).append(n)
    assert len(slices) == 3 and len({pid for _n, _f, pid in results}) == 3
    for first, members in slices.items():
        assert members == list(range(first, first + len(members)))
    assert map_parts(_slice_in_child, [7], 3) == [(7, 7, os.getpid())]


@pytest.mark.parametrize("where", ["same-fs", "other-fs"])
@pytest.mark.usefixtures("sealed")
def test_a_restage_through_forked_workers_reads_and_copies_only_what_changed(
        tmp_path: Path, other_fs: Path, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ocistage.stagers import filemanifest
    from ocistage.stagers.pool import pool_key

    monkeypatch.setattr(builder_module, "FORK_MIN_FILES", 100)
    monkeypatch.setattr(builder_module, "usable_cpus", lambda: 2)
    source = tmp_path / "src"
    for n in range(400):
        directory = source / f"d{n % 5}" / f"e{n % 3}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{n}").write_bytes(b"content %d\n" % n)
    to = other_fs if where == "other-fs" else tmp_path / "to"
    cache = tmp_path / "cache"
    first = stage_directory(source, to, cache_root=cache, holder=Holder.pin("t"), jobs=4)
    assert first.method == ("pool" if where == "other-fs" else "hardlink")
    read: list[str] = []
    real_hash_file = filemanifest.hash_file

    def spy(path: Path | str) -> str:
        read.append(os.fspath(path))
        return real_hash_file(path)

    monkeypatch.setattr(filemanifest, "hash_file", spy)
    (source / "d1" / "e1" / "f1").write_bytes(b"changed\n")       # new content
    (source / "d2" / "e2" / "f2").unlink()                          # gone
    (source / "d3" / "e0" / "f3").rename(source / "d3" / "moved")  # same content, new path
    (source / "d4" / "new").write_bytes(b"added\n")
    if first.method == "pool":  # an unchanged file's pool entry vanished meanwhile
        manifest = filemanifest.load_manifest(first.path / MANIFEST_NAME)
        assert manifest is not None
        f4 = {e.path: e for e in manifest.entries}["d4/e1/f4"]
        assert f4.hash is not None
        (to / ".ocistage-pool" / f4.hash[:2] / pool_key(f4.hash, f4.mode)).unlink()
    again = stage_directory(source, to, cache_root=cache, holder=Holder.pin("t"), jobs=4)
    assert again.files == 400
    if first.method == "pool":
        assert sorted(read) == sorted(os.fspath(source / p)
                                      for p in ("d1/e1/f1", "d3/moved", "d4/new"))
        assert again.copied == 2  # the changed and the added file
        assert again.linked == 1  # the moved file: its content is in the pool
        assert again.unchanged == 397  # f4 among them: copied into the pool again, unchanged
    else:
        assert read == []  # hardlinks: nothing is hashed
        assert (again.unchanged, again.linked, again.copied) == (397, 3, 0)
    for path in source.rglob("*"):
        staged = again.path / path.relative_to(source)
        if path.is_file():
            assert staged.read_bytes() == path.read_bytes()
            if first.method == "hardlink":
                assert staged.stat().st_ino == path.stat().st_ino
    staged_files = {p.relative_to(again.path) for p in again.path.rglob("*")
                    if p.is_file() and not p.name.startswith(".ocistage")}
    assert staged_files == {p.relative_to(source) for p in source.rglob("*") if p.is_file()}
    settle(cache)  # the remover of the replaced version
    if first.method == "pool":  # exactly the contents in use are pooled, each linked twice
        pooled = [p for p in (to / ".ocistage-pool").rglob("*") if p.is_file()]
        assert len(pooled) == 400 and all(p.stat().st_nlink == 2 for p in pooled)
    assert not os.path.lexists(to / ".ocistage-tmp")  # no scratch dir is left


def _task_in_child(n: int) -> tuple[int, int]:
    return n * 3, os.getpid()


def test_map_queue_hands_out_tasks_to_every_process_and_keeps_their_order() -> None:
    import time

    def timed_task(n: int) -> tuple[int, int]:
        # the process that draws task 0 takes no other while the others drain the queue
        time.sleep(0.4 if n == 0 else 0.005)
        return _task_in_child(n)

    results = map_queue(timed_task, list(range(60)), 3)
    assert [r for r, _pid in results] == [n * 3 for n in range(60)]
    by_pid: dict[int, int] = {}
    for _r, pid in results:
        by_pid[pid] = by_pid.get(pid, 0) + 1
    assert len(by_pid) == 3 and os.getpid() in by_pid
    assert by_pid[results[0][1]] == 1
    assert map_queue(_task_in_child, [5], 3) == [(15, os.getpid())]
    assert map_queue(_task_in_child, [1, 2], 1) == [(3, os.getpid()), (6, os.getpid())]


def test_map_queue_raises_a_workers_error_and_refuses_an_oversized_queue() -> None:
    with pytest.raises(FileNotFoundError) as info:
        map_queue(_fail_on_400, list(range(500)), 2)
    assert info.value.filename == "/x/400"
    with pytest.raises(ValueError):
        map_queue(_task_in_child, list(range(MAX_QUEUE + 1)), 2)


_KILLED_STAGER = """
import os, sys, time
from pathlib import Path
from ocistage.stagers.parallel import map_queue
marks = Path(sys.argv[1])

def task(n):
    (marks / str(os.getpid())).touch()  # who works on it
    time.sleep(30)
    return n

map_queue(task, list(range(4)), 3)
"""


def test_workers_die_with_a_killed_stager(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parents[2]
    stager = subprocess.Popen([sys.executable, "-c", _KILLED_STAGER, str(tmp_path)],
                              cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.iterdir())) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = {int(p.name) for p in tmp_path.iterdir()} - {stager.pid}
        assert len(workers) == 2  # the stager and two forked workers each took a task
        stager.send_signal(signal.SIGKILL)
        stager.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in workers)
    finally:
        stager.kill()
        stager.wait()


def _alive(pid: int) -> bool:
    """A process that runs (a zombie waiting for its reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _walked(n: int) -> tuple[int, tuple[int, int]]:
    """A first step: its result goes back, the pid and a value stay in the worker."""
    return n * 10, (os.getpid(), n)


def _second(offset: int, kept: dict[int, tuple[int, int]],
            claim: Callable[[int], bool]) -> dict[int, tuple[int, int]]:
    if offset < 0:
        raise FileNotFoundError(errno.ENOENT, "gone", "/second")
    return {n: (pid, value + offset) for n, (pid, value) in kept.items() if claim(n)}


def test_two_steps_keep_each_task_where_its_first_step_ran() -> None:
    with queue_in_two_steps(_walked, list(range(40)), 3) as steps:
        assert steps.results == [n * 10 for n in range(40)]
        parts = steps.then(_second, 1000)
    assert len(parts) == 3
    seen = {n: pair for part in parts for n, pair in part.items()}
    assert sorted(seen) == list(range(40))  # each task once, with what its worker kept
    assert all(value == n + 1000 for n, (_pid, value) in seen.items())
    assert {pid for pid, _value in parts[0].values()} <= {os.getpid()}  # this process's first
    for part in parts[1:]:  # (a worker that drew nothing keeps nothing)
        assert os.getpid() not in {pid for pid, _value in part.values()}


def test_two_steps_mine_and_errors() -> None:
    with queue_in_two_steps(_walked, list(range(40)), 2) as steps:
        parts = steps.then(_second, 5, mine=lambda kept, claim: {n: (0, -1) for n in kept})
    assert all(pair == (0, -1) for pair in parts[0].values())
    with queue_in_two_steps(_walked, list(range(40)), 2) as steps, \
            pytest.raises(FileNotFoundError) as info:
        steps.then(_second, -1)
    assert info.value.filename == "/second"
    with queue_in_two_steps(_walked, list(range(40)), 2) as steps:
        pass  # closed without a second step: the worker ends
    with pytest.raises(FileNotFoundError):
        queue_in_two_steps(_fail_on_400_first, list(range(500, 0, -1)), 2)


def _fail_on_400_first(n: int) -> tuple[int, None]:
    return _fail_on_400(n), None


def _claim_all(_argument: None, kept: dict[int, tuple[int, int]],
               claim: Callable[[int], bool]) -> list[int]:
    """A second step that takes every task it can, its own first, then the others'."""
    return [n for n in [*sorted(kept), *range(40)] if claim(n)]


def test_each_task_is_claimed_once_whoever_asks() -> None:
    with queue_in_two_steps(_walked, list(range(40)), 3) as steps:
        parts = steps.then(_claim_all, None)
    done = [n for part in parts for n in part]
    assert sorted(done) == list(range(40))
