"""`ocistage cache ls|du|gc|verify|rm`: thin wrappers that render cache.* results."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from ocistage.bundler.cli.commands import FullSummaryGroup
from ocistage.bundler.cli.common import (
    PLATFORMS,
    CommonOptions,
    RefArg,
    complete_words,
    with_options,
)
from ocistage.cache.sizes import parse_age
from ocistage.errors import IntegrityError

# The cache modules are imported inside the commands (see ocistage.bundler.cli.common).

cache_app = typer.Typer(help="Inspect and clean the content-addressed cache.",
    rich_markup_mode=None, no_args_is_help=True, add_completion=False, cls=FullSummaryGroup)


MaxSizeOpt = Annotated[str | None, typer.Option(
    "--max-size", metavar="SIZE",
    help="Evict least recently used images and bundles until the cache fits SIZE (500M, 20G, "
         "1.5T) [default: max_size from the config file, else no limit].")]
OlderThanOpt = Annotated[str | None, typer.Option(
    "--older-than", metavar="AGE",
    help="Evict images and bundles last used longer than AGE ago (30m, 12h, 7d).")]
DryRunOpt = Annotated[bool, typer.Option(
    "--dry-run", "-n", help="Only report what would be removed.")]


# -- ls --------------------------------------------------------------------------------------------

@cache_app.command("ls")
@with_options("cache", "json")
def cache_ls(opts: CommonOptions) -> None:
    """List cached images and bundles with sizes, last use and leases."""
    from ocistage.cache.listing import listing

    opts.emit(listing(opts.store()), rich=True)


# -- du --------------------------------------------------------------------------------------------

@cache_app.command("du")
@with_options("cache", "json")
def cache_du(opts: CommonOptions) -> None:
    """Show the cache's logical size (without dedup) and its size on disk."""
    from ocistage.cache.diskusage import disk_usage

    opts.emit(disk_usage(opts.store()), rich=True)


# -- gc and rm -------------------------------------------------------------------------------------

@cache_app.command("gc")
@with_options("cache", "json", "quiet")
def cache_gc(
    max_size: MaxSizeOpt = None,
    older_than: OlderThanOpt = None,
    dry_run: DryRunOpt = False,
    *,
    opts: CommonOptions,
) -> None:
    """Remove orphans and leftovers, then least recently used content; never leased content.

    In the configured pyxis_store, if only its owner writes it, an importer image is retired
    first (no get hands it out) and removed by a gc an hour later (docs/site.md).

    In a group-shared cache, another member's trees are evicted by rename only and reported
    as left to them: their next command (or root's gc) removes them."""
    from ocistage.cache.gc import GcOptions, collect

    settings = opts.settings(max_size=max_size)
    store = opts.store(settings)
    site = settings.pyxis_store
    options = GcOptions(max_size=settings.max_size,
                        older_than=parse_age(older_than) if older_than else None,
                        dry_run=dry_run,
                        retire_images=site is not None and _read_only_site(site, store.root))
    opts.emit(collect(store, options), rich=True)


def _read_only_site(site: Path, root: Path) -> bool:
    """Whether the cache at ``root`` is the configured ``pyxis_store`` and only its owner
    writes it (a site's store): its users only read it and leave no lease, so its gc retires
    images before it removes them (docs/site.md). A group-shared store's members lease."""
    try:
        return os.path.samefile(site, root) and not os.stat(root).st_mode & 0o022
    except OSError:
        return False


@cache_app.command("rm")
@with_options("cache", "json", "quiet")
def cache_rm(
    ref: RefArg,
    platform: Annotated[str | None, typer.Option(
        "--platform", metavar="OS/ARCH[/VARIANT]", autocompletion=complete_words(*PLATFORMS),
        help="Remove only this platform's entry [default: every platform of REF].")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Drop the ref even while a live lease names it (leased content "
                        "stays until the lease ends).")] = False,
    *,
    opts: CommonOptions,
) -> None:
    """Drop REF from the cache and, right away, what only it used (unless leased)."""
    from ocistage.bundler.image.reference import parse_reference
    from ocistage.bundler.pull import ref_name
    from ocistage.cache.gc import remove_ref

    store = opts.store()
    name = ref_name(parse_reference(ref))
    opts.emit(remove_ref(store, name, platform=platform, force=force), rich=True)


# -- verify ----------------------------------------------------------------------------------------

@cache_app.command("verify")
@with_options("cache", "json")
def cache_verify(
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, max=64,
                                      help="Blobs hashed in parallel.")] = 2,
    dry_run: DryRunOpt = False,
    *,
    opts: CommonOptions,
) -> None:
    """Re-hash every blob, check refs, bundles and snapshots; quarantine what is corrupt
    (exit 1)."""
    from ocistage.cache.verify import verify

    store = opts.store()
    report = verify(store, jobs=jobs, dry_run=dry_run)
    opts.emit(report, rich=True)
    if not report.ok:
        raise IntegrityError(
            f"cache verify found {len(report.problems)} problems in {store.root}",
            "corrupt entries were moved to CACHE/quarantine and refs that needed them were "
            "dropped; pull those images again" if not dry_run else
            "run `ocistage cache verify` without --dry-run to quarantine them")
