"""The table of ``ocistage``'s commands, and the group that builds only the one that runs.

Every command line pays for what it imports and for typer turning functions into click
commands (signatures read, options made: ~2 ms a command here, ~30 ms for all of them). The
top-level group (:class:`LazyGroup`) knows each command by its entry in :data:`COMMANDS`:
the module that defines it, the ``typer.Typer`` there that holds it (one command, or a
group such as ``cache``), and its one-line summary for ``ocistage --help``. A command's
module is imported and its click command built when the command is looked up: ``ocistage
bundle ...`` loads ``ocistage.bundler.cli.image`` and builds ``bundle`` alone, ``ocistage --help``
and ``--version`` load no command module at all. ``tests/bundler/test_cli_commands.py``
checks that every summary is the command's own (its docstring's first sentence). Summaries are
shown in full, wrapped (:class:`FullSummaryGroup`, also the groups' class), never cut.
"""

from __future__ import annotations

import errno
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand, TyperGroup

from ocistage.bundler.cli.failure import ClosedStdout, PipeError, stdout_closed

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass(frozen=True)
class CommandEntry:
    """Where a top-level command lives: ``module``'s ``typer.Typer`` named ``app``."""

    module: str
    app: str
    summary: str
    group: bool = False  # a group of subcommands (``cache ls``), even of one (``config show``)


#: every top-level command, in the order ``ocistage --help`` lists them
COMMANDS: dict[str, CommandEntry] = {
    "pull": CommandEntry(
        "ocistage.bundler.cli.image", "pull_app",
        "Fetch an image into the cache; print its manifest digest."),
    "inspect": CommandEntry(
        "ocistage.bundler.cli.image", "inspect_app",
        "Show an image's manifest, config, platforms and layer sizes."),
    "bundle": CommandEntry(
        "ocistage.bundler.cli.image", "bundle_app",
        "Make a rootless OCI bundle from an image; print its path."),
    "stage": CommandEntry(
        "ocistage.bundler.cli.stage", "stage_app",
        "Put a bundle where jobs run (shared or node-local); print its path."),
    "unstage": CommandEntry(
        "ocistage.bundler.cli.stage", "unstage_app",
        "Remove a staged bundle (and its lease) safely."),
    "submit": CommandEntry(
        "ocistage.bundler.cli.slurm", "submit_app",
        "Pull, bundle and stage REF, then sbatch --container it."),
    "cache": CommandEntry(
        "ocistage.bundler.cli.cache", "cache_app", "Inspect and clean the content-addressed cache.",
        group=True),
    "config": CommandEntry(
        "ocistage.bundler.cli.config", "config_app",
        "Show the configuration (options, environment, config files).", group=True),
    "runtime": CommandEntry(
        "ocistage.bundler.cli.slurm", "runtime_app",
        "Generate Slurm runtime configuration (oci.conf, scrun.lua).", group=True),
    "trust": CommandEntry(
        "ocistage.bundler.cli.trust", "trust_app",
        "Show the image policy (containers-policy.json) and its verdicts.", group=True),
    "doctor": CommandEntry(
        "ocistage.bundler.cli.doctor", "doctor_app",
        "Check what this host lacks for the other commands, and how to fix it."),
    "scrun": CommandEntry(
        "ocistage.bundler.cli.slurm", "scrun_app",
        "Entry points called by the scrun.lua stage hooks.", group=True),
}


def load_command(name: str) -> Any:
    """The click command of top-level command ``name``: its module imported, typer's command
    (or group) built from the ``typer.Typer`` there, named ``name``."""
    entry = COMMANDS[name]
    app: typer.Typer = getattr(importlib.import_module(entry.module), entry.app)
    command = typer.main.get_group(app) if entry.group else typer.main.get_command(app)
    command.name = name
    return command


class FullSummaryGroup(TyperGroup):
    """A group whose ``--help`` gives each command's summary in full, wrapped to the width
    (click cuts it at the end of the line, mid-sentence): ``ocistage``'s and its groups'."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, summary) for name, summary in self.summaries(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def summaries(self, ctx: Any) -> list[tuple[str, str]]:
        """(name, summary) of each command that ``--help`` lists."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(_WHOLE)))
        return rows


#: a length no summary reaches: click's short help is then the whole first sentence
_WHOLE = 10_000


class LazyGroup(FullSummaryGroup):
    """The ``ocistage`` group: its commands come from :data:`COMMANDS` when looked up."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except OSError as error:
            if error.errno != errno.EPIPE:
                raise
            if stdout_closed():
                raise ClosedStdout from error
            raise PipeError(error) from error

    def list_commands(self, ctx: Any) -> list[str]:
        return [*COMMANDS, *(name for name in self.commands if name not in COMMANDS)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in COMMANDS:
            command = self.commands[cmd_name] = load_command(cmd_name)
        return command

    def summaries(self, ctx: Any) -> list[tuple[str, str]]:
        """The command list of ``--help`` from the table: no command module is imported."""
        names: Sequence[str] = self.list_commands(ctx)
        rows = []
        for name in names:
            entry = COMMANDS.get(name)
            # a bare command carrying the table's summary: click reads it as any command's
            command = (TyperCommand(name, help=entry.summary) if entry is not None
                       else self.commands[name])
            if not command.hidden:
                rows.append((name, command.get_short_help_str(_WHOLE)))
        return rows
