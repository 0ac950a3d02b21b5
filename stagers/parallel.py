"""Running many small file operations in parallel without per-item overhead.

Submitting one future per file costs more than a ``link()`` itself; work is handed out in
batches (contiguous slices of about equal byte weight): to a thread pool
(:func:`map_batched`), or — for thousands of files, where the GIL serialises the Python code
between the syscalls — to forked processes, one per CPU (:func:`map_parts`); tasks of
unknown size go to forked processes one at a time from a queue (:func:`map_queue`), also in two
steps whose workers keep what the first made for a second the stager decides on
(:func:`queue_in_two_steps`).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import pickle
import signal
import struct
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Generic, TypeVar

from ocistage.cache.fdio import write_all

T = TypeVar("T")
R = TypeVar("R")
K = TypeVar("K")
V = TypeVar("V")
X = TypeVar("X")

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

    from concurrent.futures import ThreadPoolExecutor  # only where threads copy

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
    read_fd = _task_queue(len(tasks))
    drain = partial(_drain, read_fd, function, tasks)
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


def _task_queue(count: int) -> int:
    """The read end of a pipe holding the task numbers ``0 .. count - 1``, written whole and
    closed before any worker forks (a read of 4 bytes is atomic: each number goes to one)."""
    read_fd, write_fd = os.pipe()
    try:
        write_all(write_fd, b"".join(_TASK.pack(n) for n in range(count)))
    finally:
        os.close(write_fd)
    return read_fd


def _drain(read_fd: int, function: Callable[[T], R], tasks: Sequence[T]) -> dict[int, R]:
    """``function`` of each task whose number this process reads from the queue, by number,
    until the queue is empty; one that fails empties it first, so nobody starts another."""
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


class Claims:
    """Tasks that any of the processes forked after this was made can claim, each once (a
    byte per task in a shared memory file, under a POSIX record lock: the kernel drops one a
    killed process held, so no claim waits on a dead worker), so that one that is done with
    its own tasks can take over another's that was not started yet."""

    def __init__(self, count: int) -> None:
        self._fd = os.memfd_create("ocistage-claims", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, max(1, count))
        self._taken = mmap.mmap(self._fd, max(1, count))  # shared: inherited by forks

    def claim(self, number: int) -> bool:
        """Whether task ``number`` is the caller's now (False: another claimed it first)."""
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            if self._taken[number]:
                return False
            self._taken[number] = 1
            return True
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd >= 0:
            self._taken.close()
            os.close(self._fd)
            self._fd = -1


#: a second step (:meth:`TwoSteps.then`): (argument, what the worker kept by task number,
#: :meth:`Claims.claim` of the tasks) -> its result
Second = Callable[[V, dict[int, K], Callable[[int], bool]], X]


class TwoSteps(Generic[R, K]):
    """Forked workers that drained a queue of tasks (:func:`queue_in_two_steps`) and keep, per
    task, what its first step made, for a second step this process decides on after seeing
    the first results: :meth:`then` hands one to every worker (this process included),
    :meth:`close` ends them. A context manager: leaving it ends the workers."""

    def __init__(self, results: list[R], kept: dict[int, K],
                 children: list[tuple[int, int, int]], claims: Claims) -> None:
        self.results = results  # the first step's, in task order
        self._kept = kept  # this process's tasks
        self._children = children  # (pid, command pipe, result pipe)
        self.claims = claims

    def then(self, second: Second[V, K, X], argument: V,
             mine: Callable[[dict[int, K], Callable[[int], bool]], X] | None = None,
             ) -> list[X]:
        """``second(argument, kept, claim)`` in every worker, with ``kept`` the task numbers
        it drew and what its first step kept of each, and ``claim`` :meth:`Claims.claim` of
        the tasks (a second step that may take over others' tasks claims each it does, its
        own too); one result per worker, this process's first (``mine(kept, claim)``
        instead, if given: what the stager does meanwhile). ``second`` must be a
        module-level function (it is pickled by name) and obey the rules of
        :func:`map_parts`. A worker's exception is raised here after all ended."""
        command = pickle.dumps((second, argument), protocol=pickle.HIGHEST_PROTOCOL)
        children, self._children = self._children, []
        sent: list[tuple[int, int]] = []
        try:
            for pid, command_fd, result_fd in children:
                try:
                    write_all(command_fd, command)
                finally:
                    os.close(command_fd)
                sent.append((pid, result_fd))
            claim = self.claims.claim
            results = [mine(self._kept, claim) if mine is not None
                       else second(argument, self._kept, claim)]
        except BaseException:
            _stop([(pid, fd) for pid, fd, _ in children])
            raise
        finally:
            outcomes = [_collect(pid, fd) for pid, fd in sent]
            for pid, _command, result_fd in children[len(sent):]:
                outcomes.append(_collect(pid, result_fd))
            self.claims.close()
        for ok, value in outcomes:
            if not ok:
                raise value
            results.append(value)
        return results

    def close(self) -> None:
        """End the workers without a second step (each reads the end of its command pipe)."""
        children, self._children = self._children, []
        for pid, command_fd, result_fd in children:
            os.close(command_fd)
            _collect(pid, result_fd)
        self.claims.close()

    def __enter__(self) -> TwoSteps[R, K]:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is not None:
            _stop([(pid, fd) for pid, fd, _ in self._children])
        self.close()


def queue_in_two_steps(first: Callable[[T], tuple[R, K]], tasks: Sequence[T],
                       processes: int) -> TwoSteps[R, K]:
    """:func:`map_queue` of ``first``, whose results are pairs: the first of each comes back
    here (:attr:`TwoSteps.results`), the second stays in the worker that ran the task, for
    :meth:`TwoSteps.then` (e.g. the records of a walked subtree, placed once the stager knows
    the tree changed: nothing is sent back and forth for them). ``processes - 1`` workers are
    forked; with ``processes`` <= 1 or one task, this process does it all."""
    if len(tasks) > MAX_QUEUE:
        raise ValueError(f"at most {MAX_QUEUE} tasks fit in the queue")
    claims = Claims(len(tasks))
    if processes <= 1 or len(tasks) <= 1:
        done = {n: first(task) for n, task in enumerate(tasks)}
        return TwoSteps([done[n][0] for n in range(len(tasks))],
                        {n: pair[1] for n, pair in done.items()}, [], claims)
    read_fd = _task_queue(len(tasks))
    drain = partial(_drain, read_fd, first, tasks)
    children: list[tuple[int, int, int]] = []
    try:
        for _ in range(processes - 1):
            children.append(_fork_two_step_worker(drain, claims))
        own = drain()
    except BaseException:
        _stop([(pid, fd) for pid, fd, _ in children])
        for pid, command_fd, result_fd in children:
            os.close(command_fd)
            _collect(pid, result_fd)
        raise
    finally:
        os.close(read_fd)
    steps: TwoSteps[R, K] = TwoSteps([], {n: pair[1] for n, pair in own.items()}, children,
                                     claims)
    with _closed_on_error(steps):
        results: dict[int, R] = {n: pair[0] for n, pair in own.items()}
        for _pid, _command_fd, result_fd in children:
            ok, value = _read_one(result_fd)
            if not ok:
                raise value
            results.update(value)
        steps.results = [results[n] for n in range(len(tasks))]
    return steps


@contextlib.contextmanager
def _closed_on_error(steps: TwoSteps[Any, Any]) -> Iterator[None]:
    try:
        yield
    except BaseException:
        steps.__exit__(BaseException, None, None)
        raise


def _fork_two_step_worker(drain: Callable[[], dict[int, tuple[Any, Any]]], claims: Claims,
                          ) -> tuple[int, int, int]:
    """A worker of :func:`queue_in_two_steps`: (pid, command pipe, result pipe)."""
    command_read, command_write = os.pipe()
    result_read, result_write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the parent's code
        status = 1
        try:
            _die_with(parent)
            os.close(command_write)
            os.close(result_read)
            with os.fdopen(result_write, "wb") as out, os.fdopen(command_read, "rb") as inp:
                try:
                    done = drain()
                    _dump(out, (True, {n: pair[0] for n, pair in done.items()}))
                except BaseException as exc:  # handed to the parent
                    _dump(out, (False, exc))
                    raise
                out.flush()
                try:
                    second, argument = pickle.load(inp)
                except EOFError:  # closed: no second step
                    status = 0
                    raise
                try:
                    value = second(argument, {n: pair[1] for n, pair in done.items()},
                                   claims.claim)
                    _dump(out, (True, value))
                    status = 0
                except BaseException as exc:
                    _dump(out, (False, exc))
        finally:
            os._exit(status)
    os.close(command_read)
    os.close(result_write)
    return pid, command_write, result_read


def _dump(out: Any, payload: tuple[bool, object]) -> None:
    try:
        pickle.dump(payload, out, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        pickle.dump((False, OSError(f"a staging worker failed: {payload[1]!r}")), out)


def _read_one(read_fd: int) -> tuple[bool, Any]:
    """One pickled payload from a worker's result pipe (which stays open)."""
    with os.fdopen(os.dup(read_fd), "rb") as source:
        try:
            ok, value = pickle.load(source)
        except (pickle.UnpicklingError, EOFError, ValueError):
            return False, OSError("a staging worker ended without a result")
    return bool(ok), value


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
