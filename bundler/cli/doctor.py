"""`ocistage doctor`: what this host can do, what is missing, what to do about it."""

from __future__ import annotations

from typing import Annotated

import typer

from ocistage.bundler.cli.common import CommonOptions, with_options

# The library is imported inside the command (see ocistage.bundler.cli.common).

doctor_app = typer.Typer(rich_markup_mode=None, add_completion=False)


@doctor_app.command("doctor")
@with_options("cache", "insecure_registry", "mirror", "ca_file", "json", "verbose")
def doctor_command(
    ref: Annotated[str | None, typer.Argument(
        metavar="[REF]", help="Also check that REF's registry answers (no image is fetched).")
    ] = None,
    registry: Annotated[str | None, typer.Option(
        "--registry", metavar="HOST[:PORT]", help="Also check that this registry answers.")
    ] = None,
    to: Annotated[str | None, typer.Option(
        "--to", metavar="DIR|URL",
        help="Check this stage target [default: the configured one, stage_to].")] = None,
    *,
    opts: CommonOptions,
) -> None:
    """Check what this host lacks for the other commands, and how to fix it.

    Exit 1 if the core commands (pull, bundle, stage, cache) lack something.
    """
    from ocistage.bundler.doctor.diagnose import DoctorOptions, diagnose
    from ocistage.bundler.doctor.registry import registry_to_check
    from ocistage.bundler.doctor.report import core_problem

    options = DoctorOptions(stage_to=to, registry=registry_to_check(ref, registry))
    report = diagnose(opts.settings, options)
    opts.emit(report)
    problem = core_problem(report)
    if problem is not None:
        raise problem
