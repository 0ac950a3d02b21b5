"""ocistage.bundler.progress: bars on a terminal, set up by the first download only."""

from __future__ import annotations

import io
import subprocess
import sys
import threading

from rich.console import Console

from ocistage.bundler.progress import RichPullProgress
from ocistage.cache.digest import Digest

DIGEST = Digest("sha256", "ab" * 32)
OTHER = Digest("sha256", "cd" * 32)


def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=100), out


def test_a_run_that_downloads_nothing_draws_nothing() -> None:
    console, out = _terminal()
    with RichPullProgress(console) as progress:
        progress.blob_finished(DIGEST, reused=True)  # what a warm pull reports
        progress.blob_advanced(DIGEST, 10)
    assert out.getvalue() == ""


def test_downloads_draw_bars_and_clear_them() -> None:
    console, out = _terminal()
    with RichPullProgress(console) as progress:
        progress.blob_started(DIGEST, 1000, "layer 1/2", 0)
        progress.blob_started(OTHER, None, "layer 2/2", 500)
        progress.blob_advanced(DIGEST, 400)
        progress.blob_finished(DIGEST, reused=False)
        progress.blob_advanced(OTHER, 100)
        progress.blob_finished(OTHER, reused=False)
    drawn = out.getvalue()
    assert "layer 1/2" in drawn and DIGEST.short in drawn
    assert "layer 2/2" in drawn and "(resumed)" in drawn


def test_downloads_from_many_threads() -> None:
    console, out = _terminal()
    digests = [Digest("sha256", f"{n:064x}") for n in range(16)]

    def download(digest: Digest) -> None:
        progress.blob_started(digest, 100, "layer", 0)
        for _ in range(10):
            progress.blob_advanced(digest, 10)
        progress.blob_finished(digest, reused=False)

    with RichPullProgress(console) as progress:
        threads = [threading.Thread(target=download, args=(d,)) for d in digests]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert "layer" in out.getvalue()


def test_nothing_is_drawn_after_the_context_ended() -> None:
    console, out = _terminal()
    with RichPullProgress(console) as progress:
        pass
    progress.blob_started(DIGEST, 10, "late", 0)  # a download thread outliving the command
    progress.blob_advanced(DIGEST, 5)
    progress.blob_finished(DIGEST, reused=False)
    assert out.getvalue() == ""


def test_a_warm_run_does_not_import_rich_progress() -> None:
    code = (
        "import io, sys\n"
        "from rich.console import Console\n"
        "from ocistage.bundler.progress import RichPullProgress\n"
        "from ocistage.cache.digest import Digest\n"
        "console = Console(file=io.StringIO(), force_terminal=True)\n"
        "with RichPullProgress(console) as progress:\n"
        "    progress.blob_finished(Digest('sha256', 'ab' * 32), reused=True)\n"
        "assert 'rich.progress' not in sys.modules, 'imported'\n"
        "progress2 = RichPullProgress(console)\n"
        "with progress2:\n"
        "    progress2.blob_started(Digest('sha256', 'ab' * 32), 1, 'layer', 0)\n"
        "assert 'rich.progress' in sys.modules, 'not imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
