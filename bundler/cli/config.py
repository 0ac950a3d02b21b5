"""`ocistage config show`: the effective settings and where each comes from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from ocistage.bundler.cli.common import (
    CacheOpt,
    CaFileOpt,
    InsecureOpt,
    JobsOpt,
    JsonOpt,
    MirrorOpt,
    PullOpt,
    load_cli_settings,
    print_json,
    shown,
    stdout,
)

if TYPE_CHECKING:
    from ocistage.bundler.settings import Settings

config_app = typer.Typer(help="Show the configuration (options, environment, config files).",
    rich_markup_mode=None, no_args_is_help=True, add_completion=False)


def _values(settings: Settings) -> dict[str, Any]:
    return {
        "cache": str(settings.cache),
        "jobs": settings.jobs,
        "pull": settings.pull,
        "max_size": settings.max_size,
        "unpack_limit": settings.unpack_limit,
        "stage_to": settings.stage_to,
        "ca_file": settings.ca_file,
        "loopback_insecure": settings.loopback_insecure,
        "keep_snapshot": settings.keep_snapshot,
        "pyxis_store": str(settings.pyxis_store) if settings.pyxis_store else None,
        "insecure_registries": sorted(settings.insecure_registries),
        "mirrors": {host: list(urls) for host, urls in sorted(settings.mirrors.items())},
    }


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(value) or "-"
    if isinstance(value, dict):
        return "; ".join(f"{host} -> {', '.join(urls)}" for host, urls in value.items()) or "-"
    return str(value)


@config_app.command("show")
def config_show(
    ctx: typer.Context,
    cache: CacheOpt = None,
    insecure_registry: InsecureOpt = None,
    mirror: MirrorOpt = None,
    ca_file: CaFileOpt = None,
    jobs: JobsOpt = None,
    pull_policy: PullOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Print the effective settings and where each comes from (option, environment, which
    config file, default); the options are those of the other commands."""
    from ocistage.bundler.settings import SITE_CONFIG, user_config_path

    # --cache also reads $OCISTAGE_CACHE: leave that to the settings, which name it
    source = ctx.get_parameter_source("cache")
    from_command_line = source is not None and source.name == "COMMANDLINE"
    settings = load_cli_settings(cache=cache if from_command_line else None,
                                 insecure=insecure_registry, mirror=mirror,
                                 ca_file=ca_file, jobs=jobs, pull=pull_policy)
    values = _values(settings)
    files = [{"path": str(path), "exists": path.is_file()}
             for path in (SITE_CONFIG, user_config_path())]
    if json_output:
        print_json({"settings": {key: {"value": value, "origin": settings.origins[key]}
                                 for key, value in values.items()},
                    "files": files})
        return
    width = max(map(len, values))
    for key, value in values.items():
        stdout.print(f"{key:<{width}}  {shown(_text(value))}  "
                     f"[dim]({shown(settings.origins[key])})[/dim]")
    for file in files:
        state = "" if file["exists"] else " (absent)"
        stdout.print(f"[dim]config file: {shown(file['path'])}{state}[/dim]")

