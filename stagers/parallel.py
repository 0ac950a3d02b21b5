"""Running many small file operations on a thread pool without per-item overhead.

Submitting one future per file costs more than a ``link()`` itself; work is handed to the pool
in batches (contiguous slices of about equal byte weight), each batch run by one thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def batches(items: Sequence[T], weight: Callable[[T], int], count: int) -> list[Sequence[T]]:
    """Split ``items`` into at most ``count`` contiguous slices of about equal total weight."""
    if count <= 1 or len(items) <= 1:
        return [items] if items else []
    total = sum(weight(item) + 4096 for item in items)
    share = total / count
    result: list[Sequence[T]] = []
    start, acc = 0, 0.0
    for n, item in enumerate(items):
        acc += weight(item) + 4096
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
