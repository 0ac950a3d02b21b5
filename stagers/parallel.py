"""Running many small file operations in parallel without per-item overhead.

Submitting one future per file costs more than a ``link()`` itself; work is handed out in
batches (contiguous slices of about equal byte weight): to a thread pool
(:func:`map_batched`), or — for thousands of files, where the GIL serialises the Python code
between the syscalls — to forked processes, one per CPU (:func:`map_parts`); tasks of
unknown size go to forked processes one at a time from a queue (:func:`map_queue`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from ocistage.cache.fdio import write_all

T = TypeVar("T")
R = TypeVar("R")

_TASK = struct.Struct("=I")
#: tasks whose numbers fit in any pipe's buffer, written before the first fork: at least one
#: page (a user over ``pipe-user-pages-soft`` gets pipes of one page, not 64 KiB)
MAX_QUEUE = 4096 // _TASK.size


def batches(items: Sequence[T], weight: Callable[[T], int], count: int) -> list[Sequence[T]]:
    """Split ``items`` into at most ``count`` contiguous slices of about equal total weight."""
    if count <= 1 or len(items) <= 1:
        return [items] if items else []
    weights = [weight(item) + 4096 for item in items]
    share = sum(weights) / count
    result: list[Sequence[T]] = []
    start, acc = 0, 0.0
    for n, item_weight in enumerate(weights):
        acc += item_weight
        if acc >= share and len(result) < count - 1:
            result.append(items[start:n + 1])
            start, acc = n + 1, 0.0
    if start < len(items):
        result.append(items[start:])
    return result


def map_batched(function: Callable[[T], R], items: Sequence[T], jobs: int,
                weight: Callable[[T], int] = lambda _item: 0,
                min_items: int = 64) -> list[R]:
    """``[function(item) for item in items]``, run by ``jobs`` threads in weighted batches."""
    if jobs <= 1 or len(items) < min_items:
        return [function(item) for item in items]
    parts = batches(items, weight, jobs * 4)

    def run(part: Sequence[T]) -> list[R]:
        return [function(item) for item in part]

    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="stage") as pool:
        return [result for chunk in pool.map(run, parts) for result in chunk]


def map_parts(function: Callable[[Sequence[T]], list[R]], items: Sequence[T], processes: int,
              weight: Callable[[T], int] = lambda _item: 0) -> list[R]:
    """``function`` over ``items`` split into ``processes`` contiguous slices of about equal
    weight, each run by a forked child (the first by this process); ``function`` takes a whole
    slice and returns one result per item (so it can keep state, e.g. open directories,
    across its slice). The results come back in order.

    For many small file operations a thread pool is held back by the GIL: each ``open``,
    ``write`` or ``link`` is a few microseconds of kernel work around Python code that holds
    it. Forked children run truly in parallel. ``function`` must only touch the filesystem
    (no locks, no threads, no logging: a forked child has none of its parent's threads); its
    results come back pickled through a pipe. A child's exception is re-raised here after
    every child has ended.
    """
    parts = batches(items, weight, processes)
    if len(parts) <= 1:
        return function(items)
    children: list[tuple[int, int]] = []
    try:
        for part in parts[1:]:
            children.append(_fork_worker(partial(function, part)))
        results = function(parts[0])
    except BaseException:
        _stop(children)
        raise
    finally:
        outcomes = [_collect(pid, fd) for pid, fd in children]
    for ok, value in outcomes:
        if not ok:
            raise value
        results.extend(value)
    return results


def map_queue(function: Callable[[T], R], tasks: Sequence[T], processes: int) -> list[R]:
    """``[function(task) for task in tasks]``, the tasks handed out one at a time to
    ``processes`` forked workers (this process is one of them) as each becomes free.

    For tasks of unknown and unequal size (subtrees of a directory tree): a worker that
    drew a large task takes no more while the others drain the rest. The queue is a pipe of
    task numbers, written whole and closed before the first fork; each worker reads 4 bytes
    at a time (one pipe read is atomic) until EOF. A worker that fails empties the queue, so
    the others stop soon. ``function`` obeys the rules of :func:`map_parts`; results
    come back in task order.
    """
    if processes <= 1 or len(tasks) <= 1:
        return [function(task) for task in tasks]
    if len(tasks) > MAX_QUEUE:
        raise ValueError(f"at most {MAX_QUEUE} tasks fit in the queue")
    read_fd, write_fd = os.pipe()
    try:
        write_all(write_fd, b"".join(_TASK.pack(n) for n in range(len(tasks))))
    finally:
        os.close(write_fd)

    def drain() -> dict[int, R]:
        done: dict[int, R] = {}
        try:
            while len(number := os.read(read_fd, _TASK.size)) == _TASK.size:
                (n,) = _TASK.unpack(number)
                done[n] = function(tasks[n])
        except BaseException:
            while os.read(read_fd, 1 << 16):  # nobody starts another task
                pass
            raise
        return done

    children: list[tuple[int, int]] = []
    try:
        for _ in range(processes - 1):
            children.append(_fork_worker(drain))
        results = drain()
    except BaseException:
        _stop(children)
        raise
    finally:
        outcomes = [_collect(pid, fd) for pid, fd in children]
        os.close(read_fd)
    for ok, value in outcomes:
        if not ok:
            raise value
        results.update(value)
    return [results[n] for n in range(len(tasks))]


def _fork_worker(function: Callable[[], object]) -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the parent's code
        status = 1
        try:
            _die_with(parent)
            os.close(read_fd)
            with os.fdopen(write_fd, "wb") as out:
                try:
                    payload: tuple[bool, object] = (True, function())
                    status = 0
                except BaseException as exc:  # handed to the parent
                    payload = (False, exc)
                try:
                    pickle.dump(payload, out, protocol=pickle.HIGHEST_PROTOCOL)
                except (pickle.PicklingError, TypeError, AttributeError):
                    pickle.dump((False, OSError(f"a staging worker failed: {payload[1]!r}")),
                                out)
        finally:
            os._exit(status)
    os.close(write_fd)
    return pid, read_fd


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """In a forked worker: have the kernel kill it when the stager dies (``kill -9``
    included), so no orphan goes on writing into a scratch tree that the next stager
    removes. The stager's thread waits for its workers, so only its death can end it first.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the request was made
        os._exit(1)


def _stop(children: list[tuple[int, int]]) -> None:
    """This process's share failed or was interrupted (Ctrl-C, SIGTERM): the workers are
    killed rather than waited for, so a stop is prompt and nothing writes on into the scratch
    tree its cleanup removes. They are reaped by :func:`_collect` as usual."""
    for pid, _fd in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _collect(pid: int, read_fd: int) -> tuple[bool, Any]:
    try:
        with os.fdopen(read_fd, "rb") as source:
            data = source.read()
    finally:
        _pid, status = os.waitpid(pid, 0)
    try:
        ok, value = pickle.loads(data)
    except (pickle.UnpicklingError, EOFError, ValueError):
        return False, OSError(f"a staging worker ended without a result (status {status})")
    return bool(ok), value
