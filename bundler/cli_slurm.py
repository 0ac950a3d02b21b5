"""`ocistage runtime ...`, `ocistage scrun ...` and `ocistage submit`: the Slurm hand-off."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bundler.cli_common import RefArg, not_implemented, stdout
from cache.errors import UsageError
from runtimes.oci_conf import RUNTIMES, Mode, OciConfOptions, lint_oci_conf, render_oci_conf
from runtimes.slurm import SlurmVersion, installed_version

runtime_app = typer.Typer(help="Generate Slurm runtime configuration (oci.conf, scrun.lua).",
    rich_markup_mode=None, no_args_is_help=True)
scrun_app = typer.Typer(help="Entry points called by the scrun.lua stage hooks.",
    rich_markup_mode=None, no_args_is_help=True)

SlurmVersionOpt = Annotated[str | None, typer.Option(
    "--slurm-version", metavar="X.Y",
    help="Generate for this Slurm release [default: the installed one, `scontrol --version`].")]


def register(app: typer.Typer) -> None:
    app.command("submit", context_settings={"allow_extra_args": True,
                                            "ignore_unknown_options": True})(submit_command)


def _slurm_version(text: str | None) -> SlurmVersion:
    return SlurmVersion.parse(text) if text else installed_version()


def submit_command(ref: RefArg, ctx: typer.Context) -> None:
    """Pull, bundle and stage REF, then sbatch --container it: REF [SBATCH OPTS] -- CMD."""
    not_implemented("submit")


@runtime_app.command("oci-conf")
def runtime_oci_conf(
    runtime: Annotated[str, typer.Option(
        "--runtime", metavar="|".join(RUNTIMES), help="The OCI runtime slurmstepd calls.")
    ] = "runc",
    mode: Annotated[str, typer.Option(
        "--mode", metavar="run|create",
        help="run (one RunTimeRun call, preferred) or create/start (Slurm polls state).")
    ] = "run",
    root: Annotated[str | None, typer.Option(
        "--root", metavar="DIR",
        help="Runtime state directory (may use Slurm patterns) [default: "
             "/run/user/%U/ocistage-RUNTIME].")] = None,
    slurm_version: SlurmVersionOpt = None,
    check: Annotated[Path | None, typer.Option(
        "--check", metavar="FILE",
        help="Lint FILE instead: one line per problem, exit 1 if there are any.")] = None,
) -> None:
    """Print an oci.conf for Slurm for a given runtime (runc, crun, nvidia, ...)."""
    version = _slurm_version(slurm_version)
    if check is not None:
        try:
            text = check.read_text()
        except OSError as exc:
            raise UsageError(f"cannot read {check}: {exc.strerror}") from exc
        problems = lint_oci_conf(text, version)
        for problem in problems:
            stdout.print(f"{check}: {problem}", markup=False)
        if problems:
            raise typer.Exit(1)
        return
    if runtime == "nvidia":
        runtime = "nvidia-container-runtime"
    if runtime not in RUNTIMES:
        raise UsageError(f"unknown runtime {runtime!r}", f"choose one of {', '.join(RUNTIMES)}")
    if mode not in ("run", "create"):
        raise UsageError(f"unknown mode {mode!r}", "choose run or create")
    chosen: Mode = "run" if mode == "run" else "create"
    text = render_oci_conf(OciConfOptions(runtime=runtime, mode=chosen, root=root,
                                          version=version))
    stdout.print(text, end="", markup=False)


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
