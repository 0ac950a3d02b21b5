"""`ocistage pull`, `ocistage inspect` and `ocistage bundle`: the image commands."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ocistage.bundler.cli.common import (
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
    echo,
    image_inputs,
    load_cli_settings,
    print_json,
    print_warnings,
    setup_logging,
    shown,
    stdout,
)
from ocistage.cache.sizes import format_size

if TYPE_CHECKING:
    from ocistage.bundler.inspect import ImageReport
    from ocistage.bundler.pull import PulledImage

# The library is imported inside the commands (see ocistage.bundler.cli.common).

# the commands' typer apps, built when their command runs (ocistage.bundler.cli.commands)
pull_app = typer.Typer(rich_markup_mode=None, add_completion=False)
inspect_app = typer.Typer(rich_markup_mode=None, add_completion=False)
bundle_app = typer.Typer(rich_markup_mode=None, add_completion=False)

# -- pull ------------------------------------------------------------------------------------


def _pulled_json(image: PulledImage, cache: Path) -> dict[str, Any]:
    return {
        "name": image.name,
        "digest": str(image.manifest.digest),
        "media_type": image.manifest.media_type,
        "index_digest": str(image.index_digest) if image.index_digest else None,
        "platform": str(image.platform),
        "config": str(image.config_digest),
        "layers": [{"digest": str(layer.digest), "media_type": layer.media_type,
                    "size": layer.size} for layer in image.layers],
        "size": image.size,
        "fetched_bytes": image.fetched_bytes,
        "reused_blobs": image.reused_blobs,
        "cache": str(cache),
        "warnings": [str(warning) for warning in image.warnings],
    }


@pull_app.command("pull")
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
    from ocistage.bundler.pull import pull

    setup_logging(verbose)
    settings = load_cli_settings(cache=cache, insecure=insecure_registry, mirror=mirror,
                                 ca_file=ca_file, jobs=jobs, pull=pull_policy)
    source, store, options = image_inputs(ref, settings, platform)
    with download_progress(quiet or json_output) as progress:
        image = pull(source, store, options, progress)
    print_warnings(image.warnings, quiet)
    if json_output:
        print_json(_pulled_json(image, settings.cache))
        return
    if not quiet:
        echo(f"pulled {image.name} ({image.platform}, {len(image.layers)} layers, "
             f"{format_size(image.size)}; fetched {format_size(image.fetched_bytes)}, "
             f"reused {image.reused_blobs} blobs)", err=True)
    echo(str(image.manifest.digest))


# -- inspect ---------------------------------------------------------------------------------


def _render_report(report: ImageReport) -> None:
    import json

    settings = report.config.container
    stdout.print(f"[bold]{shown(report.source)}[/bold]")
    stdout.print(f"  digest:     {report.digest}  ({shown(report.media_type)})")
    if report.platforms:
        stdout.print("  platforms:  " + ", ".join(
            shown(p) if p else "unknown" for p, _ in report.platforms))
    stdout.print(f"  platform:   {shown(report.platform)}  manifest {report.manifest.digest}")
    stdout.print(f"  created:    {shown(report.config.created or '-')}")
    for key, value in (("entrypoint", settings.entrypoint), ("cmd", settings.cmd),
                       ("workdir", settings.working_dir), ("user", settings.user)):
        if value:
            stdout.print(f"  {key + ':':<12}{shown(json.dumps(value))}")
    for variable in settings.env:
        stdout.print(f"  env:        {shown(variable)}")
    for label, value in settings.labels.items():
        stdout.print(f"  label:      {shown(label)}={shown(value)}")
    for n, layer in enumerate(report.layers, start=1):
        stdout.print(f"  layer {n}:{'':<3}{layer.digest}  {format_size(layer.size):>10}  "
                     f"{shown(layer.media_type)}")
    stdout.print(f"  total:      {format_size(report.compressed_size)} "
                 f"in {len(report.layers)} layers")


@inspect_app.command("inspect")
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
    from ocistage.bundler.inspect import inspect_image

    setup_logging(verbose)
    settings = load_cli_settings(cache=cache, insecure=insecure_registry, mirror=mirror,
                                 ca_file=ca_file)
    report = inspect_image(*image_inputs(ref, settings, platform))
    if json_output:
        print_json(report.to_json())
    else:
        _render_report(report)


# -- bundle ------------------------------------------------------------------------------------


@bundle_app.command("bundle")
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
    keep_snapshot: Annotated[bool | None, typer.Option(
        "--keep-snapshot/--no-keep-snapshot",
        help="Unpack the image into a snapshot kept in the cache and copy DEST from it, so a "
             "later --link or cached bundle of it unpacks nothing; writes the tree twice "
             "[default: keep_snapshot in the config file, else only where copies from the "
             "cache are reflinks, e.g. btrfs, XFS].")] = None,
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
    from ocistage.bundler.bundle import make_bundle
    from ocistage.bundler.runtime_config import ConfigOptions

    setup_logging(verbose)
    settings = load_cli_settings(cache=cache, insecure=insecure_registry, mirror=mirror,
                                 ca_file=ca_file, jobs=jobs, pull=pull_policy,
                                 keep_snapshot=keep_snapshot)
    source, store, options = image_inputs(ref, settings, platform)
    config_options = ConfigOptions(
        rootless=rootless, args=cmd or None, entrypoint=entrypoint or None, env=env or (),
        mounts=mount or (), readonly=readonly, hostname=hostname, gpus=gpus,
        map_root=map_root)
    with download_progress(quiet or json_output) as progress:
        result = make_bundle(source, store, dest, pull_options=options,
                             config_options=config_options, progress=progress, link=link,
                             keep_snapshot=settings.keep_snapshot)
    print_warnings(result.warnings, quiet)
    if json_output:
        print_json({"path": str(result.path), "reused": result.reused,
                    "layers_applied": result.layers_applied,
                    "warnings": [str(warning) for warning in result.warnings],
                    "image": _pulled_json(result.image, settings.cache)})
        return
    if not quiet:
        verb = "reused" if result.reused else "made"
        echo(f"{verb} bundle of {result.image.name} "
             f"({result.image.platform}, {len(result.image.layers)} layers)", err=True)
    echo(str(result.path))
