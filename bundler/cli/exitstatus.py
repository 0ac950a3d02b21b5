"""The exit status a command chose, kept under ``python -m`` after an interrupt it handled.

CPython (3.8 to at least 3.12) notes when a KeyboardInterrupt ends code it evaluates from a
string (``exec`` or ``eval`` of source, which every dataclass and named tuple definition does,
so any import), even when a caller catches that interrupt. Run as ``python -m``, the
interpreter then ends the process by SIGINT after ``sys.exit``, whatever status was given. A
command whose Ctrl-C or SIGTERM lands during a lazy import cleans up and exits 130; this keeps
that status. Console scripts (``ocistage``, ``ocistage-pyxis-importer``) do not take that path.
"""

from __future__ import annotations


def keep_exit_status() -> None:
    """Clear the interpreter's note of an interrupted string evaluation: evaluating a string
    resets it first. Call right before ``sys.exit``."""
    eval("None")  # a constant: nothing from outside is evaluated
