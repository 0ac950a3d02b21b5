"""How a command's process ends: with the status it chose, at once.

:func:`end_process` ends the process without tearing the interpreter down when only the main
thread runs: the atexit handlers run (logging's, the finalizers of temporary directories),
the standard streams are flushed, and the process exits. Freeing the objects of the ~400
modules a command imported one by one took about 5 ms of every command (half of a re-stage's
exit; a twentieth of a warm ``bundle``); the kernel frees the process's memory at once.
Where other threads still run (a download that cannot be cut short), the interpreter ends as
usual, which waits for them.

The exit status a command chose is kept under ``python -m`` after an interrupt it handled:

CPython (3.8 to at least 3.12) notes when a KeyboardInterrupt ends code it evaluates from a
string (``exec`` or ``eval`` of source, which every dataclass and named tuple definition does,
so any import), even when a caller catches that interrupt. Run as ``python -m``, the
interpreter then ends the process by SIGINT after ``sys.exit``, whatever status was given. A
command whose Ctrl-C or SIGTERM lands during a lazy import cleans up and exits 130; this keeps
that status. Console scripts (``ocistage``, ``ocistage-pyxis-importer``) do not take that path.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from typing import NoReturn


def keep_exit_status() -> None:
    """Clear the interpreter's note of an interrupted string evaluation: evaluating a string
    resets it first. Call right before ``sys.exit``."""
    eval("None")  # a constant: nothing from outside is evaluated


def end_process(code: int) -> NoReturn:
    """End this process with exit status ``code`` (module docstring)."""
    if threading.active_count() == 1:
        import atexit

        atexit._run_exitfuncs()  # once: it clears them
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # as the interpreter's own end would say it
            pass
        else:
            os._exit(code)
    # The interpreter's last cyclic collection traverses every object left, most of them the
    # modules a command imported; frozen, they are not traced again. docs/history/
    # performance-log.md, "Issue 29: the last round".
    gc.freeze()
    keep_exit_status()
    sys.exit(code)
