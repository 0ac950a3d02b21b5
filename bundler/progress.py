"""Download progress on a terminal (rich), and nothing at all when output is piped.

The bars, and ``rich.progress`` behind them, are set up by the first download: a warm run that
fetches nothing (everything cached) draws nothing and pays for neither (~20 ms).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from ocistage.cache.digest import Digest

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID


class RichPullProgress:
    """A :class:`ocistage.bundler.pull.PullProgress` that draws one bar per blob on stderr."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._progress: Progress | None = None
        self._tasks: dict[Digest, TaskID] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _bars(self) -> Progress:
        """The live bars, started on first use (call with ``self._lock`` held)."""
        if self._progress is None:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=self._console,
                transient=True,
            )
            self._progress.start()
        return self._progress

    def blob_started(self, digest: Digest, size: int | None, label: str, offset: int) -> None:
        with self._lock:
            if self._closed:
                return
            description = f"{label} {digest.short}" + (" (resumed)" if offset else "")
            self._tasks[digest] = self._bars().add_task(description, total=size,
                                                        completed=offset)

    def blob_advanced(self, digest: Digest, n: int) -> None:
        task = self._tasks.get(digest)
        progress = self._progress
        if task is not None and progress is not None:
            progress.advance(task, n)

    def blob_finished(self, digest: Digest, reused: bool) -> None:
        with self._lock:
            task = self._tasks.pop(digest, None)
            progress = self._progress
        if task is not None and progress is not None:
            progress.remove_task(task)

    def __enter__(self) -> RichPullProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            self._closed = True
            progress = self._progress
        if progress is not None:
            progress.stop()


class _ConsoleNotices(logging.Handler):
    """Prints each record as ``note: MESSAGE`` on a console (markup escaped)."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.INFO)
        self._console = console

    def emit(self, record: logging.LogRecord) -> None:
        from rich.markup import escape

        self._console.print(f"note: {escape(record.getMessage())}")


@contextlib.contextmanager
def retry_notices(console: Console) -> Iterator[None]:
    """Show a line per registry retry (logger ``ocistage.retry``) on ``console``.

    Without this the retries go to the log like everything else (visible with ``-v``).
    """
    logger = logging.getLogger("ocistage.retry")
    handler = _ConsoleNotices(console)
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
