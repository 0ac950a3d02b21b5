"""The ``ocistage`` command line: the top-level group and the boundary where errors are shown.

This is the only module that imports all four packages (through the command modules). The
commands live in the modules of this package (``image``: pull, inspect, bundle; ``stage``,
``slurm``, ``cache``, ``config``, ``doctor``, ``trust``); :mod:`ocistage.bundler.cli.commands`
lists them, and a command's module is imported only when that command runs. :func:`run` is the
boundary between the library and the user of ``ocistage`` (``ocistage-pyxis-importer`` has its
own, :func:`ocistage.bundler.pyxis.main.run`; both render by one rule,
:func:`ocistage.bundler.cli.failure.failure`): errors from the library arrive as
:class:`ocistage.errors.OcistageError` and are rendered as one ``error:`` line plus a ``hint:``
line (exit 1, or 2 for usage errors); any other exception is one line too; tracebacks are
shown only with ``-v``. A closed stdout ends a command quietly with 141, as SIGPIPE ends ``ls``
(docs/cli.md)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from ocistage.bundler.cli import bashcompletion
from ocistage.bundler.cli.commands import LazyGroup
from ocistage.bundler.cli.common import shown, stderr
from ocistage.bundler.cli.exitstatus import end_process
from ocistage.bundler.cli.failure import (
    CLOSED_STDOUT,
    INTERRUPTED,
    Failure,
    Voice,
    failure,
    stdout_closed,
)
from ocistage.bundler.cli.memory import limit_malloc_arenas


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


def _wants_traceback(argv: Sequence[str]) -> bool:
    options = argv[:list(argv).index("--")] if "--" in argv else argv
    return any(arg in ("-v", "--verbose") for arg in options)


#: click's base of command-line errors (vendored by typer 0.28 as typer._click, the click
#: package before): found through a public class, whichever it is
_CLICK_ERROR: type[Exception] = next(
    cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "ClickException")


INTERRUPTED_HINT = ("nothing half-done is left in place (partial downloads are kept); run the "
                    "command again to finish it")
#: how ``ocistage`` says what :mod:`ocistage.bundler.cli.failure` renders
VOICE = Voice(interrupted=INTERRUPTED_HINT, os_error="rerun with -v for details",
              internal="this is a bug in ocistage; rerun with -v and report the traceback",
              quiet_when_stdout_closes=True)


def run(argv: Sequence[str]) -> int:
    """Run the command line ``argv`` (without the program name); return the exit status.

    The one place where exceptions become what the user sees, as
    :func:`~ocistage.bundler.cli.failure.failure` says them (the traceback only with ``-v``).
    A mistake on the command line itself (typer/click's usage errors) is rendered the same
    way: its message, and the command's usage as the hint (exit 2).
    """
    try:
        code = app(args=list(argv), prog_name="ocistage", standalone_mode=False)
        sys.stdout.flush()  # here, not at exit: a closed stdout is seen while we can say so
    except SystemExit as done:  # shell completion and a closed stdout end so
        code = done.code
        if code == 1 and stdout_closed():  # click's end for EPIPE outside a command
            return _quit_closed_stdout()
    except _CLICK_ERROR as error:
        return _render_usage_error(error, argv)
    except (Exception, KeyboardInterrupt) as error:  # the boundary: no traceback unless asked
        return _end(failure(error, VOICE), argv)
    if code == INTERRUPTED:
        return _end(failure(KeyboardInterrupt(), VOICE), argv)
    return code if isinstance(code, int) else (0 if code is None else 1)


def _end(said: Failure, argv: Sequence[str]) -> int:
    """Say ``said`` (its cause's traceback first, with ``-v``); its exit status."""
    if said.quiet:
        return _quit_closed_stdout()
    if said.cause is not None and _wants_traceback(argv):
        traceback.print_exception(said.cause)
    render_error(said.message, said.hint)
    return said.code


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
    end_process(code)


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
