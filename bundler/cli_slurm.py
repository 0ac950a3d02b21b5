"""`ocistage runtime ...`, `ocistage scrun ...` and `ocistage submit`: the Slurm hand-off."""

from __future__ import annotations

import typer

from bundler.cli_common import RefArg, not_implemented

runtime_app = typer.Typer(help="Generate Slurm runtime configuration (oci.conf, scrun.lua).",
    rich_markup_mode=None, no_args_is_help=True)
scrun_app = typer.Typer(help="Entry points called by the scrun.lua stage hooks.",
    rich_markup_mode=None, no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("submit", context_settings={"allow_extra_args": True,
                                            "ignore_unknown_options": True})(submit_command)


def submit_command(ref: RefArg, ctx: typer.Context) -> None:
    """Pull, bundle and stage REF, then sbatch --container it: REF [SBATCH OPTS] -- CMD."""
    not_implemented("submit")


@runtime_app.command("oci-conf")
def runtime_oci_conf() -> None:
    """Print an oci.conf for Slurm for a given runtime (runc, crun, nvidia, ...)."""
    not_implemented("runtime oci-conf")


@runtime_app.command("scrun-lua")
def runtime_scrun_lua() -> None:
    """Print a scrun.lua whose stage hooks call `ocistage scrun ...`."""
    not_implemented("runtime scrun-lua")


@scrun_app.command("stage-in")
def scrun_stage_in() -> None:
    """Stage-in entry point called by scrun.lua."""
    not_implemented("scrun stage-in")


@scrun_app.command("stage-out")
def scrun_stage_out() -> None:
    """Stage-out entry point called by scrun.lua."""
    not_implemented("scrun stage-out")
