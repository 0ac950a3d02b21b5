"""`ocistage cache ls|du|gc|verify|rm`."""

from __future__ import annotations

import typer

from bundler.cli_common import RefArg, not_implemented

cache_app = typer.Typer(help="Inspect and clean the content-addressed cache.",
    rich_markup_mode=None, no_args_is_help=True)


@cache_app.command("ls")
def cache_ls() -> None:
    """List cached images with sizes, last use and leases."""
    not_implemented("cache ls")


@cache_app.command("du")
def cache_du() -> None:
    """Show the cache's logical and on-disk size."""
    not_implemented("cache du")


@cache_app.command("gc")
def cache_gc() -> None:
    """Remove unreferenced and least recently used content."""
    not_implemented("cache gc")


@cache_app.command("verify")
def cache_verify() -> None:
    """Re-hash cached content; report and quarantine corrupt entries."""
    not_implemented("cache verify")


@cache_app.command("rm")
def cache_rm(ref: RefArg) -> None:
    """Remove an image from the cache."""
    not_implemented("cache rm")
