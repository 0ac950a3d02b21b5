"""`ocistage config show`: the effective settings and where each comes from."""

from __future__ import annotations

from dataclasses import replace

import typer

from ocistage.bundler.cli.commands import FullSummaryGroup
from ocistage.bundler.cli.common import CommonOptions, with_options

config_app = typer.Typer(help="Show the configuration (options, environment, config files).",
    rich_markup_mode=None, no_args_is_help=True, add_completion=False, cls=FullSummaryGroup)


@config_app.command("show")
@with_options("cache", "insecure_registry", "mirror", "ca_file", "jobs", "pull", "json")
def config_show(ctx: typer.Context, opts: CommonOptions) -> None:
    """Print the effective settings and where each comes from (option, environment, which
    config file, default); the options are those of the other commands."""
    from ocistage.bundler.settings import SettingsReport

    # --cache also reads $OCISTAGE_CACHE: leave that to the settings, which name it
    source = ctx.get_parameter_source("cache")
    if source is None or source.name != "COMMANDLINE":
        opts = replace(opts, cache=None)
    opts.emit(SettingsReport(opts.settings()), rich=True)
