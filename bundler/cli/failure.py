"""Turn the exception that ended a command into what its user is told: an ``error:`` line, a
``hint:`` line and an exit status.

Both of ocistage's programs end here, ``ocistage`` (:func:`ocistage.bundler.cli.app.run`) and
``ocistage-pyxis-importer`` (:func:`ocistage.bundler.pyxis.main.run`), each saying a few things
its own way (:class:`Voice`): an :class:`~ocistage.errors.OcistageError` is its message and hint
(exit 1, 2 for usage errors), an ``OSError`` its strerror and path (exit 1), an interrupt
``interrupted`` (exit 130), anything else an internal error (exit 1). A closed stdout ends
``ocistage`` quietly with :data:`CLOSED_STDOUT`, as SIGPIPE ends ``ls``. Lean (no typer, no
rich): the importer pays for neither.
"""

from __future__ import annotations

import errno
import select
import sys
from dataclasses import dataclass
from typing import TextIO

from ocistage.bundler.cli.printable import sanitize
from ocistage.errors import OcistageError

#: the exit status when stdout's reader went away (``ocistage cache ls | head -1``): that of a
#: command killed by SIGPIPE as ``ls`` is, 128 + 13, what bash's ``pipefail`` reports for it
CLOSED_STDOUT = 141
INTERRUPTED = 130


class ClosedStdout(Exception):
    """stdout was closed by its reader (``ocistage cache ls | head -1``): the command stops."""


class PipeError(Exception):
    """A broken pipe other than stdout's (a child's), carried past click, which would end the
    command silently with exit 1 on any ``EPIPE``: the CLI's boundary shows ``error``."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def stdout_closed() -> bool:
    """Whether the reader of stdout has gone (a pipe without readers polls ``POLLERR``)."""
    stream = sys.__stdout__
    try:
        if stream is None:
            return False
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poller.poll(0))
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class Voice:
    """What one program says its own way: the hints of an interrupt, an ``OSError`` and an
    internal error; the options a hint may name and what to name instead (the importer takes
    no options, only settings); whether a closed stdout ends it quietly."""

    interrupted: str
    os_error: str | None
    internal: str
    instead: tuple[tuple[str, str], ...] = ()
    quiet_when_stdout_closes: bool = False

    def hint(self, hint: str | None) -> str | None:
        """``hint`` with the options it names replaced by what this program takes."""
        if hint is None:
            return None
        for option, setting in self.instead:
            hint = hint.replace(option, setting)
        return hint


@dataclass(frozen=True)
class Failure:
    """What the user is told: ``message`` and ``hint`` (nothing at all if ``quiet``), exit
    status ``code``; ``cause`` is the exception whose traceback ``-v`` shows, if any."""

    message: str
    hint: str | None
    code: int
    quiet: bool = False
    cause: BaseException | None = None


def failure(error: BaseException, voice: Voice) -> Failure:
    """What ``error``, which ended a command, tells the user in ``voice``."""
    if isinstance(error, KeyboardInterrupt):
        return Failure("interrupted", voice.hint(voice.interrupted), INTERRUPTED)
    if voice.quiet_when_stdout_closes:
        if isinstance(error, ClosedStdout) or (isinstance(error, BrokenPipeError)
                                               and stdout_closed()):
            return Failure("", None, CLOSED_STDOUT, quiet=True)
        if isinstance(error, BrokenPipeError):
            error = BrokenPipeError(errno.EPIPE, "Broken pipe")
    if isinstance(error, PipeError):
        error = error.error
    if isinstance(error, OcistageError):
        return Failure(error.message, voice.hint(error.hint), error.exit_code, cause=error)
    if type(error).__name__ == "Abort":  # click's: end of input at a prompt
        return Failure("aborted", None, 1)
    if isinstance(error, OSError):
        return Failure(os_error_text(error), voice.os_error, 1, cause=error)
    return Failure(f"internal error: {type(error).__name__}: {error}", voice.internal, 1,
                   cause=error)


def os_error_text(error: OSError) -> str:
    """An ``OSError`` as one line: its strerror and the paths it names."""
    text = error.strerror or str(error)
    names = [n for n in (error.filename, error.filename2) if n is not None]
    return f"{text}: {' -> '.join(map(str, names))}" if names else text


def write_failure(said: Failure, stream: TextIO | None = None) -> None:
    """``said`` as plain lines (control characters written out) on ``stream``, stderr by
    default."""
    out = sys.stderr if stream is None else stream
    out.write(f"error: {sanitize(said.message)}\n")
    if said.hint:
        out.write(f"hint: {sanitize(said.hint)}\n")
