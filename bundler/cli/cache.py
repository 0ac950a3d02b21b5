"""`ocistage cache ls|du|gc|verify|rm`: thin wrappers that render cache.* results."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ocistage.bundler.cli.common import (
    CacheOpt,
    JsonOpt,
    QuietOpt,
    RefArg,
    load_cli_settings,
    open_store,
    print_json,
    shown,
    stderr,
    stdout,
)
from ocistage.cache.errors import IntegrityError
from ocistage.cache.sizes import format_age, format_size, parse_age

if TYPE_CHECKING:
    from rich.table import Table

    from ocistage.cache.gc import GcReport
    from ocistage.cache.inventory import DiskUsage, LeaseRow, Listing

# The cache modules are imported inside the commands (see ocistage.bundler.cli.common).

cache_app = typer.Typer(help="Inspect and clean the content-addressed cache.",
    rich_markup_mode=None, no_args_is_help=True, add_completion=False)


MaxSizeOpt = Annotated[str | None, typer.Option(
    "--max-size", metavar="SIZE",
    help="Evict least recently used images and bundles until the cache fits SIZE (500M, 20G, "
         "1.5T) [default: max_size from the config file, else no limit].")]
OlderThanOpt = Annotated[str | None, typer.Option(
    "--older-than", metavar="AGE",
    help="Evict images and bundles last used longer than AGE ago (30m, 12h, 7d).")]
DryRunOpt = Annotated[bool, typer.Option(
    "--dry-run", "-n", help="Only report what would be removed.")]


def _ago(when: float) -> str:
    return f"{format_age(time.time() - when)} ago" if when > 0 else "-"


def _lease_text(leases: tuple[LeaseRow, ...]) -> str:
    return ", ".join(lease.holder + ("" if lease.live else " (dead)") for lease in leases) or "-"


# -- ls --------------------------------------------------------------------------------------------

def _table(title: str | None, columns: list[str], right: tuple[str, ...] = ()) -> Table:
    """A plain table; the last column (a name or path) folds, the others never wrap."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    for column in columns:
        last = column == columns[-1]
        table.add_column(column, justify="right" if column in right else "left",
                         overflow="fold", no_wrap=not last, min_width=24 if last else None)
    return table


def _render_listing(result: Listing) -> None:
    images = _table("images", ["DIGEST", "PLATFORM", "SIZE", "UNIQUE", "LAST USE", "BUNDLES",
                               "LEASES", "IMAGE"], right=("SIZE", "UNIQUE"))
    for row in result.images:
        broken = " (incomplete)" if row.missing else ""
        images.add_row(row.digest.removeprefix("sha256:")[:12], row.platform,
                       format_size(row.size), format_size(row.unique_size), _ago(row.last_used),
                       str(len(row.bundles)), shown(_lease_text(row.leases)),
                       shown(row.name) + broken)
    stdout.print(images)
    if result.bundles:
        bundles = _table("bundles", ["BUNDLE", "SIZE", "LAST USE", "LEASES", "IMAGE"],
                         right=("SIZE",))
        for bundle in result.bundles:
            image = shown(bundle.image or "-") + (" (gone)" if bundle.orphan else "")
            bundles.add_row(bundle.key[:12], format_size(bundle.disk), _ago(bundle.last_used),
                            shown(_lease_text(bundle.leases)), image)
        stdout.print(bundles)
    staged = [lease for lease in result.leases if lease.target.startswith("staged:")]
    if staged:
        table = _table("staged bundles", ["HOLDER", "SINCE", "LIVE", "PATH"])
        for lease in staged:
            table.add_row(shown(lease.holder), _ago(lease.created),
                          "yes" if lease.live else "no",
                          shown(lease.target.removeprefix("staged:")))
        stdout.print(table)


@cache_app.command("ls")
def cache_ls(cache: CacheOpt = None, json_output: JsonOpt = False) -> None:
    """List cached images and bundles with sizes, last use and leases."""
    from ocistage.cache.inventory import listing

    result = listing(open_store(load_cli_settings(cache=cache)))
    if json_output:
        print_json(asdict(result))
    else:
        _render_listing(result)


# -- du --------------------------------------------------------------------------------------------

def _render_du(usage: DiskUsage) -> None:
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column, justify in (("PART", "left"), ("COUNT", "right"), ("LOGICAL", "right"),
                            ("ON DISK", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    table.add_row("images (blobs per image)", str(usage.images.count),
                  format_size(usage.images.logical), "")
    for name, part in (("blobs", usage.blobs), ("snapshots", usage.snapshots),
                       ("bundles", usage.bundles),
                       ("scratch", usage.scratch), ("quarantine", usage.quarantine),
                       ("other", usage.other)):
        table.add_row(name, str(part.count), format_size(part.logical), format_size(part.disk))
    table.add_row("total", "", format_size(usage.total_logical), format_size(usage.total_disk))
    stdout.print(table)


@cache_app.command("du")
def cache_du(cache: CacheOpt = None, json_output: JsonOpt = False) -> None:
    """Show the cache's logical size (without dedup) and its size on disk."""
    from ocistage.cache.inventory import disk_usage

    usage = disk_usage(open_store(load_cli_settings(cache=cache)))
    if json_output:
        print_json({**asdict(usage), "total": {"logical": usage.total_logical,
                                               "disk": usage.total_disk}})
    else:
        _render_du(usage)


# -- gc and rm -------------------------------------------------------------------------------------

def _gc_json(report: GcReport) -> dict[str, Any]:
    return {**asdict(report), "freed": report.freed, "over_budget": report.over_budget}


def _render_gc(report: GcReport, quiet: bool) -> None:
    verb = "would remove" if report.dry_run else "removed"
    if not quiet:
        for removal in report.removed:
            if removal.kind == "usage":
                continue  # bookkeeping of entries listed anyway
            size = f" ({format_size(removal.size)})" if removal.size else ""
            stdout.print(f"{verb} {removal.kind} {shown(removal.name)}{size}: "
                         f"{shown(removal.reason)}")
        for target in report.protected:
            stdout.print(f"kept {shown(target)}: in use (leased)")
    stdout.print(f"{verb} {len(report.removed)} entries, {format_size(report.freed)}; "
                 f"cache {format_size(report.size_before)} -> {format_size(report.size_after)}")
    if report.over_budget and report.max_size is not None:
        stderr.print(f"warning: the cache holds {format_size(report.size_after)}, over its "
                     f"budget of {format_size(report.max_size)}: what remains is leased or "
                     "in use")


@cache_app.command("gc")
def cache_gc(
    max_size: MaxSizeOpt = None,
    older_than: OlderThanOpt = None,
    dry_run: DryRunOpt = False,
    cache: CacheOpt = None,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Remove orphans and leftovers, then least recently used content; never leased content."""
    from ocistage.cache.gc import GcOptions, collect

    settings = load_cli_settings(cache=cache, max_size=max_size)
    store = open_store(settings)
    options = GcOptions(max_size=settings.max_size,
                        older_than=parse_age(older_than) if older_than else None,
                        dry_run=dry_run)
    report = collect(store, options)
    if json_output:
        print_json(_gc_json(report))
    else:
        _render_gc(report, quiet)


@cache_app.command("rm")
def cache_rm(
    ref: RefArg,
    platform: Annotated[str | None, typer.Option(
        "--platform", metavar="OS/ARCH[/VARIANT]",
        help="Remove only this platform's entry [default: every platform of REF].")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Drop the ref even while a live lease names it (leased content "
                        "stays until the lease ends).")] = False,
    cache: CacheOpt = None,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Drop REF from the cache and, right away, what only it used (unless leased)."""
    from ocistage.bundler.image.reference import parse_reference
    from ocistage.bundler.pull import ref_name
    from ocistage.cache.gc import remove_ref

    store = open_store(load_cli_settings(cache=cache))
    name = ref_name(parse_reference(ref))
    report = remove_ref(store, name, platform=platform, force=force)
    if json_output:
        print_json(_gc_json(report))
    else:
        _render_gc(report, quiet)


# -- verify ----------------------------------------------------------------------------------------

@cache_app.command("verify")
def cache_verify(
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, max=64,
                                      help="Blobs hashed in parallel.")] = 2,
    dry_run: DryRunOpt = False,
    cache: CacheOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Re-hash every blob, check refs, bundles and snapshots; quarantine what is corrupt
    (exit 1)."""
    from ocistage.cache.verify import verify

    store = open_store(load_cli_settings(cache=cache))
    report = verify(store, jobs=jobs, dry_run=dry_run)
    if json_output:
        print_json({**asdict(report), "ok": report.ok})
    else:
        for problem in report.problems:
            stdout.print(f"{problem.kind}: {shown(problem.name)}: {shown(problem.detail)}; "
                         f"{shown(problem.action)}")
        stdout.print(f"checked {report.blobs} blobs ({format_size(report.bytes)}), "
                     f"{report.refs} refs, {report.bundles} bundles, "
                     f"{report.snapshots} snapshots: "
                     f"{'ok' if report.ok else f'{len(report.problems)} problems'}")
    if not report.ok:
        raise IntegrityError(
            f"cache verify found {len(report.problems)} problems in {store.root}",
            "corrupt entries were moved to CACHE/quarantine and refs that needed them were "
            "dropped; pull those images again" if not dry_run else
            "run `ocistage cache verify` without --dry-run to quarantine them")
