"""`ocistage stage` and `ocistage unstage`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bundler.cli_common import not_implemented


def register(app: typer.Typer) -> None:
    app.command("stage")(stage_command)
    app.command("unstage")(unstage_command)


def stage_command(
    what: Annotated[str, typer.Argument(metavar="REF|BUNDLE")],
    to: Annotated[str, typer.Option("--to", metavar="TARGET")],
) -> None:
    """Stage a bundle onto a shared or node-local target; print the staged path."""
    not_implemented("stage")


def unstage_command(path: Annotated[Path, typer.Argument()]) -> None:
    """Remove a staged bundle (and its lease) safely."""
    not_implemented("unstage")
