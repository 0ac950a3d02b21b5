"""`ocistage trust show [REF]`: the image policy that applies, and a REF's verdict."""

from __future__ import annotations

from typing import Annotated

import typer

from ocistage.bundler.cli.commands import FullSummaryGroup
from ocistage.bundler.cli.common import CommonOptions, complete_cached_ref, with_options

trust_app = typer.Typer(help="Show the image policy (containers-policy.json) and its verdicts.",
                        rich_markup_mode=None, no_args_is_help=True, add_completion=False,
                        cls=FullSummaryGroup)

OptionalRefArg = Annotated[str | None, typer.Argument(
    metavar="[REF]", autocompletion=complete_cached_ref,
    help="An image to judge: its manifest is resolved (no layer is fetched) and its "
         "signatures are checked against the policy.")]


@trust_app.command("show")
@with_options("cache", "platform", "insecure_registry", "mirror", "ca_file", "policy",
              "registries_d", "json", "verbose")
def trust_show(ref: OptionalRefArg = None, *, opts: CommonOptions) -> None:
    """Print the policy that applies, scope by scope, and for REF whether its signatures
    satisfy it and which key signed (as `podman image trust show`)."""
    from ocistage.bundler.image.reference import parse_reference
    from ocistage.bundler.trustshow import trust_report

    settings = opts.settings()
    source = parse_reference(ref) if ref is not None else None
    opts.emit(trust_report(source, opts.store(settings), opts.pull_options(settings)),
              rich=True)
