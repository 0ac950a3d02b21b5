"""The ``ocistage`` command line: parse options, call library functions, render results.

This is the only module that imports all four packages. Errors from the library arrive as
:class:`cache.errors.OcistageError` and are rendered as one ``error:`` line plus a ``hint:``
line (exit 1, or 2 for usage errors); tracebacks are shown only with ``-v``.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from bundler import cli_cache, cli_slurm, cli_stage
from bundler.cli_common import (
    CacheOpt,
    CaFileOpt,
    InsecureOpt,
    JobsOpt,
    JsonOpt,
    MirrorOpt,
    PlatformOpt,
    PullOpt,
    QuietOpt,
    RefArg,
    VerboseOpt,
    download_progress,
    human_size,
    print_json,
    print_warnings,
    pull_options,
    settings_from,
    setup_logging,
    stderr,
    stdout,
)
from cache.errors import OcistageError

if TYPE_CHECKING:
    from bundler.inspect import ImageReport
    from bundler.pull import PulledImage

# The library is imported inside the commands: each command line loads what it uses only
# (see bundler.cli_common).

app = typer.Typer(
    rich_markup_mode=None,
    name="ocistage",
    help="Registry images -> rootless OCI bundles -> staged where Slurm jobs run.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(cli_cache.cache_app, name="cache")
app.add_typer(cli_slurm.runtime_app, name="runtime")
app.add_typer(cli_slurm.scrun_app, name="scrun")

# -- pull ------------------------------------------------------------------------------------


def _pulled_json(image: PulledImage, cache: Path) -> dict[str, Any]:
    return {
        "name": image.name,
        "digest": str(image.manifest.digest),
        "mediaType": image.manifest.media_type,
        "indexDigest": str(image.index_digest) if image.index_digest else None,
        "platform": str(image.platform),
        "config": str(image.config_digest),
        "layers": [{"digest": str(layer.digest), "mediaType": layer.media_type,
                    "size": layer.size} for layer in image.layers],
        "size": image.size,
        "fetchedBytes": image.fetched_bytes,
        "reusedBlobs": image.reused_blobs,
        "cache": str(cache),
        "warnings": list(image.warnings),
    }


@app.command("pull")
def pull_command(
    ref: RefArg,
    cache: CacheOpt = None,
    platform: PlatformOpt = None,
    insecure_registry: InsecureOpt = None,
    mirror: MirrorOpt = None,
    ca_file: CaFileOpt = None,
    jobs: JobsOpt = None,
    pull_policy: PullOpt = None,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Fetch an image's manifest, config and layers into the cache; print the manifest digest."""
    from bundler.pull import pull
    from bundler.reference import parse_reference
    from cache.store import Store

    setup_logging(verbose)
    source = parse_reference(ref)
    settings = settings_from(cache, insecure_registry, mirror, ca_file, jobs, pull_policy)
    store = Store.open(settings.cache)
    options = pull_options(settings, platform)
    with download_progress(quiet or json_output) as progress:
        image = pull(source, store, options, progress)
    print_warnings(image.warnings)
    if json_output:
        print_json(_pulled_json(image, settings.cache))
        return
    if not quiet:
        stderr.print(
            f"pulled {escape(image.name)} ({image.platform}, {len(image.layers)} layers, "
            f"{human_size(image.size)}; fetched {human_size(image.fetched_bytes)}, "
            f"reused {image.reused_blobs} blobs)")
    stdout.print(str(image.manifest.digest))


# -- inspect ---------------------------------------------------------------------------------


def _render_report(report: ImageReport) -> None:
    settings = report.config.container
    stdout.print(f"[bold]{escape(report.source)}[/bold]")
    stdout.print(f"  digest:     {report.digest}  ({report.media_type})")
    if report.platforms:
        stdout.print("  platforms:  " + ", ".join(
            str(p) if p else "unknown" for p, _ in report.platforms))
    stdout.print(f"  platform:   {report.platform}  manifest {report.manifest.digest}")
    stdout.print(f"  created:    {report.config.created or '-'}")
    for key, value in (("entrypoint", settings.entrypoint), ("cmd", settings.cmd),
                       ("workdir", settings.working_dir), ("user", settings.user)):
        if value:
            stdout.print(f"  {key + ':':<12}{escape(json.dumps(value))}")
    for variable in settings.env:
        stdout.print(f"  env:        {escape(variable)}")
    for label, value in settings.labels.items():
        stdout.print(f"  label:      {escape(label)}={escape(value)}")
    for n, layer in enumerate(report.layers, start=1):
        stdout.print(f"  layer {n}:{'':<3}{layer.digest}  {human_size(layer.size):>10}  "
                     f"{layer.media_type}")
    stdout.print(f"  total:      {human_size(report.compressed_size)} "
                 f"in {len(report.layers)} layers")


@app.command("inspect")
def inspect_command(
    ref: RefArg,
    cache: CacheOpt = None,
    platform: PlatformOpt = None,
    insecure_registry: InsecureOpt = None,
    mirror: MirrorOpt = None,
    ca_file: CaFileOpt = None,
    json_output: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Show an image's manifest, config, platforms and layer sizes (layers are not fetched)."""
    from bundler.inspect import inspect_image
    from bundler.reference import parse_reference
    from cache.store import Store

    setup_logging(verbose)
    source = parse_reference(ref)
    settings = settings_from(cache, insecure_registry, mirror, ca_file, None)
    report = inspect_image(source, Store.open(settings.cache), pull_options(settings, platform))
    if json_output:
        print_json(report.to_json())
    else:
        _render_report(report)


# -- commands of the contract that later releases fill in ----------------------------------------


@app.command("bundle")
def bundle_command(
    ref: RefArg,
    dest: Annotated[Path | None, typer.Argument(
        metavar="[DEST]", help="Bundle directory to create [default: in the cache, keyed by "
                               "image digest and options].")] = None,
    cmd: Annotated[list[str] | None, typer.Option(
        "--cmd", "--arg", metavar="ARG",
        help="Replace the image's Cmd (repeat for each argument; Entrypoint is kept).")] = None,
    entrypoint: Annotated[list[str] | None, typer.Option(
        "--entrypoint", metavar="ARG",
        help="Replace the image's Entrypoint (repeatable; clears the image's Cmd).")] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", metavar="NAME=VALUE", help="Set an environment variable (repeatable).")
    ] = None,
    mount: Annotated[list[str] | None, typer.Option(
        "--mount", metavar="SRC:DST[:ro]", help="Bind-mount a host path (repeatable).")] = None,
    readonly: Annotated[bool, typer.Option(
        "--readonly", help="Make the container's root filesystem read-only.")] = False,
    hostname: Annotated[str | None, typer.Option(
        "--hostname", help="Give the container its own UTS namespace with this hostname.")
    ] = None,
    rootless: Annotated[bool, typer.Option(
        "--rootless/--no-rootless",
        help="Rootless config: user namespace mapping you to the image user, no cgroups.")
    ] = True,
    map_root: Annotated[bool, typer.Option(
        "--map-root", help="Rootless: run as root inside the container instead of the image "
                           "user.")] = False,
    link: Annotated[bool, typer.Option(
        "--link", help="Make DEST from the cache's snapshot by hard links: fast, shares files "
                       "with the cache, so the root filesystem is read-only (a copy where "
                       "DEST refuses links from the cache, e.g. another mount).")] = False,
    gpus: Annotated[str | None, typer.Option(
        "--gpus", metavar="all|IDS", help="Expose NVIDIA GPUs (prestart hook + CDI "
                                          "annotation).")] = None,
    cache: CacheOpt = None,
    platform: PlatformOpt = None,
    insecure_registry: InsecureOpt = None,
    mirror: MirrorOpt = None,
    ca_file: CaFileOpt = None,
    jobs: JobsOpt = None,
    pull_policy: PullOpt = None,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Make a rootless OCI bundle (rootfs/ + config.json) from an image; print its path."""
    from bundler.bundle import make_bundle
    from bundler.reference import parse_reference
    from bundler.runtime_config import ConfigOptions
    from cache.store import Store

    setup_logging(verbose)
    source = parse_reference(ref)
    settings = settings_from(cache, insecure_registry, mirror, ca_file, jobs, pull_policy)
    store = Store.open(settings.cache)
    config_options = ConfigOptions(
        rootless=rootless, args=cmd or None, entrypoint=entrypoint or None, env=env or (),
        mounts=mount or (), readonly=readonly, hostname=hostname, gpus=gpus,
        map_root=map_root)
    with download_progress(quiet or json_output) as progress:
        result = make_bundle(source, store, dest, pull_options=pull_options(settings, platform),
                             config_options=config_options, progress=progress, link=link)
    print_warnings(result.warnings)
    if json_output:
        print_json({"path": str(result.path), "reused": result.reused,
                     "image": _pulled_json(result.image, settings.cache)})
        return
    if not quiet:
        verb = "reused" if result.reused else "made"
        stderr.print(f"{verb} bundle of {escape(result.image.name)} "
                     f"({result.image.platform}, {len(result.image.layers)} layers)")
    stdout.print(str(result.path))


cli_stage.register(app)
cli_slurm.register(app)


# -- entry point -------------------------------------------------------------------------------


def render_error(error: OcistageError) -> None:
    stderr.print(f"[bold red]error:[/bold red] {escape(error.message)}")
    if error.hint:
        stderr.print(f"[dim]hint:[/dim] {escape(error.hint)}")


def main() -> None:
    verbose = any(arg in ("-v", "--verbose") for arg in sys.argv[1:])
    try:
        app()
    except OcistageError as error:
        if verbose:
            logging.getLogger("ocistage").exception("details")
        render_error(error)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        stderr.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
