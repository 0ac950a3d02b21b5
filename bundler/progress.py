"""Download progress on a terminal (rich), and nothing at all when output is piped."""

from __future__ import annotations

import threading
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from cache.digest import Digest


class RichPullProgress:
    """A :class:`bundler.pull.PullProgress` that draws one bar per blob on stderr."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._tasks: dict[Digest, TaskID] = {}
        self._lock = threading.Lock()

    def blob_started(self, digest: Digest, size: int | None, label: str, offset: int) -> None:
        with self._lock:
            description = f"{label} {digest.short}" + (" (resumed)" if offset else "")
            self._tasks[digest] = self._progress.add_task(description, total=size,
                                                          completed=offset)

    def blob_advanced(self, digest: Digest, n: int) -> None:
        task = self._tasks.get(digest)
        if task is not None:
            self._progress.advance(task, n)

    def blob_finished(self, digest: Digest, reused: bool) -> None:
        with self._lock:
            task = self._tasks.pop(digest, None)
        if task is not None:
            self._progress.remove_task(task)

    def __enter__(self) -> RichPullProgress:
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._progress.stop()
