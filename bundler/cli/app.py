"""The ``ocistage`` command line: the top-level group and the boundary where errors are shown.

This is the only module that imports all four packages (through the command modules). The
commands live in the modules of this package (``image``: pull, inspect, bundle; ``stage``,
``slurm``, ``cache``, ``config``, ``doctor``, ``trust``); :mod:`ocistage.bundler.cli.commands`
lists them, and a command's module is imported only when that command runs. :func:`run` is the
boundary between the library and the user of ``ocistage`` (``ocistage-pyxis-importer`` has its
own, :func:`ocistage.bundler.cli.pyxis.run`): errors from the library arrive as
:class:`ocistage.errors.OcistageError` and are rendered as one ``error:`` line plus a ``hint:``
line (exit 1, or 2 for usage errors); any other exception is one line too; tracebacks are
shown only with ``-v``. A closed stdout ends a command quietly with 141, as SIGPIPE ends ``ls``
(docs/cli.md)."""

from __future__ import annotations

import errno
import gc
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from ocistage.bundler.cli import bashcompletion
from ocistage.bundler.cli.commands import ClosedStdout, LazyGroup, PipeError, stdout_closed
from ocistage.bundler.cli.common import shown, stderr
from ocistage.bundler.cli.memory import limit_malloc_arenas
from ocistage.errors import OcistageError


def _version(value: bool) -> None:
    if value:
        # the package's own constant (pyproject reads it too): importlib.metadata would scan
        # site-packages, ~25 ms of every `ocistage --version`
        from ocistage import __version__

        sys.stdout.write(f"ocistage {__version__}\n")
        raise typer.Exit()


bashcompletion.use()
app = typer.Typer(
    cls=LazyGroup,
    rich_markup_mode=None,
    name="ocistage",
    help="Registry images -> rootless OCI bundles -> staged where Slurm jobs run.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _main_options(
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_version, help="Print the version and exit.")
    ] = False,
) -> None:
    """Registry images -> rootless OCI bundles -> staged where Slurm jobs run."""


# -- the boundary: every exception becomes one error line --------------------------------------


def render_error(message: str, hint: str | None) -> None:
    stderr.print(f"[bold red]error:[/bold red] {shown(message)}")
    if hint:
        stderr.print(f"[dim]hint:[/dim] {shown(hint)}")


def _os_error_text(error: OSError) -> str:
    text = error.strerror or str(error)
    names = [n for n in (error.filename, error.filename2) if n is not None]
    return f"{text}: {' -> '.join(map(str, names))}" if names else text


def _wants_traceback(argv: Sequence[str]) -> bool:
    options = argv[:list(argv).index("--")] if "--" in argv else argv
    return any(arg in ("-v", "--verbose") for arg in options)


#: click's base of command-line errors (vendored by typer 0.28 as typer._click, the click
#: package before): found through a public class, whichever it is
_CLICK_ERROR: type[Exception] = next(
    cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "ClickException")


#: the exit status when stdout's reader went away (``ocistage cache ls | head -1``): that of a
#: command killed by SIGPIPE as ``ls`` is, 128 + 13, what bash's ``pipefail`` reports for it
CLOSED_STDOUT = 141

INTERRUPTED_HINT = ("nothing half-done is left in place (partial downloads are kept); run the "
                    "command again to finish it")


def run(argv: Sequence[str]) -> int:
    """Run the command line ``argv`` (without the program name); return the exit status.

    The one place where exceptions become what the user sees: an :class:`OcistageError` is
    its message and hint (exit 1, 2 for usage errors), an ``OSError`` its strerror and path
    (exit 1), anything else an internal error (exit 1); the traceback only with ``-v``.
    A mistake on the command line itself (typer/click's usage errors) is rendered the same
    way: its message, and the command's usage as the hint (exit 2). A closed stdout ends the
    command quietly with :data:`CLOSED_STDOUT`; Ctrl-C is ``error: interrupted``, exit 130.
    """
    try:
        code = app(args=list(argv), prog_name="ocistage", standalone_mode=False)
        sys.stdout.flush()  # here, not at exit: a closed stdout is seen while we can say so
    except SystemExit as done:  # shell completion and a closed stdout end so
        code = done.code
        if code == 1 and stdout_closed():  # click's end for EPIPE outside a command
            return _quit_closed_stdout()
    except KeyboardInterrupt:
        code = 130
    except ClosedStdout:
        return _quit_closed_stdout()
    except BrokenPipeError:
        if not stdout_closed():
            return _render_exception(argv, BrokenPipeError(errno.EPIPE, "Broken pipe"))
        return _quit_closed_stdout()
    except PipeError as error:
        return _render_exception(argv, error.error)
    except _CLICK_ERROR as error:
        return _render_usage_error(error, argv)
    except Exception as error:  # the boundary: no traceback unless asked
        return _render_exception(argv, error)
    if code == 130:
        render_error("interrupted", INTERRUPTED_HINT)
    return code if isinstance(code, int) else (0 if code is None else 1)


def _render_exception(argv: Sequence[str], error: Exception) -> int:
    """``error`` as one ``error:`` line and a hint (the traceback with ``-v``); its exit
    status."""
    if type(error).__name__ == "Abort":  # click's: end of input at a prompt
        render_error("aborted", None)
        return 1
    if _wants_traceback(argv):
        traceback.print_exception(error)
    if isinstance(error, OcistageError):
        render_error(error.message, error.hint)
        return error.exit_code
    if isinstance(error, OSError):
        render_error(_os_error_text(error), "rerun with -v for details")
        return 1
    render_error(f"internal error: {type(error).__name__}: {error}",
                 "this is a bug in ocistage; rerun with -v and report the traceback")
    return 1


def _quit_closed_stdout() -> int:
    """End quietly after stdout's reader went away: stdout points at /dev/null from now on, so
    that nothing (the interpreter's last flush) fails on it again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError):
        pass
    return CLOSED_STDOUT


def _command_path(argv: Sequence[str]) -> str:
    """``ocistage cache gc`` for ``["cache", "gc", "--max-size"]``: the command words."""
    command: Any = typer.main.get_command(app)
    path = ["ocistage"]
    for word in argv:
        get = getattr(command, "get_command", None)
        command = get(None, word) if get is not None else None
        if command is None:
            break
        path.append(word)
    return " ".join(path)


def _render_usage_error(error: Exception, argv: Sequence[str]) -> int:
    """click's usage error as ours: ``error:`` its message, ``hint:`` the command's usage."""
    ctx = getattr(error, "ctx", None)
    code = getattr(error, "exit_code", 2)
    if type(error).__name__ == "NoArgsIsHelpError" and ctx is not None:
        stderr.print(ctx.get_help(), markup=False, highlight=False)  # `ocistage cache`
        return int(code)
    if type(error).__name__ == "NoSuchOption" and ctx is not None and ctx.parent is None:
        return _render_top_level_option(str(getattr(error, "option_name", "")))
    message = str(getattr(error, "format_message", lambda: str(error))())
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    message = message.removesuffix(".")
    hint = None
    if ctx is not None:
        usage = " ".join(ctx.get_usage().split())
        usage = usage[len("Usage: "):] if usage.startswith("Usage: ") else usage
        hint = f"usage: {usage} ('{ctx.command_path} --help' for more)"
    else:  # raised by the parser before the command's context existed
        hint = f"'{_command_path(argv)} --help' shows the usage"
    render_error(message, hint)
    return int(code)


def _render_top_level_option(option: str) -> int:
    """An option before the command (``ocistage --cache DIR ls``): where it goes, if a
    command takes it; the options ``ocistage`` itself takes otherwise."""
    from ocistage.bundler.cli.common import shared_option_names

    if option in shared_option_names():
        render_error(f"{option} goes after the command",
                     f"write it after the command, e.g. 'ocistage pull {option} ... REF'; "
                     "before the command only --version and --help are taken")
    else:
        render_error(f"no such option: {option}",
                     "before the command only --version and --help are taken; "
                     "'ocistage --help' lists the commands, 'ocistage COMMAND --help' "
                     "their options")
    return 2


def main() -> None:
    limit_malloc_arenas()  # before any thread allocates
    _stop_on_termination()
    code = run(sys.argv[1:])
    if code == 130 and _left_behind():
        # interrupted while a download thread was still connecting (a connect cannot be cut
        # short; ocistage.bundler.pull.CANCEL_GRACE): end now, as after kill -9 what it leaves is
        # recovered (partial downloads are resumed, locks and leases of a dead pid expire)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    # The interpreter's last cyclic collection traverses every object left, most of them the
    # ~370 modules a command imported; frozen, they are not traced again. Objects are still
    # released and atexit handlers run (logging, temporary directories' finalizers); only what
    # is in a reference cycle is left to the process's end, and no command leaves work to such
    # an object's finalizer. docs/history/performance-log.md, "Issue 29: the last round".
    gc.freeze()
    sys.exit(code)


def _stop_on_termination() -> None:
    """SIGTERM (a workflow tool's ``terminate()``, systemd, Slurm's time limit) and SIGHUP (a
    closed terminal) stop ocistage as Ctrl-C does (issue 27.6): KeyboardInterrupt in the main
    thread, so children are killed and waited for (``cp``, ``mksquashfs``, forked staging
    workers), scratch directories are removed and partial downloads kept, and a re-run starts
    clean. A signal the caller ignores (``nohup``) stays ignored."""
    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, interrupt)


def _left_behind() -> bool:
    """Whether other threads still run: interpreter exit would wait for download workers
    (concurrent.futures joins its workers at exit, daemon threads or not)."""
    return any(thread.is_alive() for thread in threading.enumerate()
               if thread is not threading.main_thread())


if __name__ == "__main__":
    main()
