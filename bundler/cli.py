"""The ``ocistage`` command line: parse options, call library functions, render results.

This is the only module that imports all four packages. Errors from the library arrive as
:class:`cache.errors.OcistageError` and are rendered as one ``error:`` line plus a ``hint:``
line (exit 1, or 2 for usage errors); tracebacks are shown only with ``-v``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from bundler.bundle import make_bundle
from bundler.inspect import ImageReport, inspect_image
from bundler.platform import Platform
from bundler.progress import RichPullProgress
from bundler.pull import PulledImage, PullOptions, pull
from bundler.reference import parse_reference
from bundler.runtime_config import ConfigOptions
from bundler.settings import Settings, load_settings
from cache.errors import NotImplementedYet, OcistageError
from cache.store import Store

app = typer.Typer(
    name="ocistage",
    help="Registry images -> rootless OCI bundles -> staged where Slurm jobs run.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
cache_app = typer.Typer(help="Inspect and clean the content-addressed cache.",
                        no_args_is_help=True)
runtime_app = typer.Typer(help="Generate Slurm runtime configuration (oci.conf, scrun.lua).",
                          no_args_is_help=True)
scrun_app = typer.Typer(help="Entry points called by the scrun.lua stage hooks.",
                        no_args_is_help=True)
app.add_typer(cache_app, name="cache")
app.add_typer(runtime_app, name="runtime")
app.add_typer(scrun_app, name="scrun")

stdout = Console(soft_wrap=True, highlight=False)
stderr = Console(stderr=True, soft_wrap=True, highlight=False)

# -- shared options ----------------------------------------------------------------------------

RefArg = Annotated[str, typer.Argument(
    metavar="REF",
    help="[docker://]registry/repo[:tag][@sha256:...], oci:PATH[:tag], "
         "oci-archive:FILE[:tag] or docker-archive:FILE[:name:tag]")]
CacheOpt = Annotated[Path | None, typer.Option(
    "--cache", metavar="DIR", envvar="OCISTAGE_CACHE", show_envvar=True,
    help="Cache directory [default: $XDG_CACHE_HOME/ocistage].")]
PlatformOpt = Annotated[str | None, typer.Option(
    "--platform", metavar="OS/ARCH[/VARIANT]",
    help="Platform to choose from a multi-platform image [default: this host].")]
InsecureOpt = Annotated[list[str] | None, typer.Option(
    "--insecure-registry", metavar="HOST[:PORT]",
    help="Use plain HTTP or unverified TLS for this registry (repeatable; also "
         "$OCISTAGE_INSECURE_REGISTRIES, comma-separated). Loopback hosts are plain HTTP "
         "by default.")]
MirrorOpt = Annotated[list[str] | None, typer.Option(
    "--mirror", metavar="REGISTRY=URL",
    help="Try this mirror before REGISTRY (repeatable), e.g. docker.io=https://mirror:5000.")]
CaFileOpt = Annotated[Path | None, typer.Option(
    "--ca-file", metavar="FILE", help="Extra CA bundle to verify HTTPS registries with.")]
JobsOpt = Annotated[int | None, typer.Option(
    "--jobs", "-j", min=1, max=64, help="Parallel blob downloads [default: 6].")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress, only the result.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log what happens (stderr).")]


def _settings(cache: Path | None, insecure: list[str] | None, mirror: list[str] | None,
              ca_file: Path | None, jobs: int | None) -> Settings:
    return load_settings(cache=cache, jobs=jobs, ca_file=str(ca_file) if ca_file else None,
                         insecure=insecure or (), mirrors=mirror or ())


def _pull_options(settings: Settings, platform: str | None) -> PullOptions:
    return PullOptions(platform=Platform.parse(platform) if platform else None,
                       jobs=settings.jobs, registry=settings.registry_config())


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _not_implemented(command: str) -> NoReturn:
    raise NotImplementedYet(f"`ocistage {command}` is not implemented yet")


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
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Fetch an image's manifest, config and layers into the cache; print the manifest digest."""
    _setup_logging(verbose)
    source = parse_reference(ref)
    settings = _settings(cache, insecure_registry, mirror, ca_file, jobs)
    store = Store.open(settings.cache)
    options = _pull_options(settings, platform)
    show_progress = stderr.is_terminal and not quiet and not json_output
    with contextlib.ExitStack() as stack:
        progress = stack.enter_context(RichPullProgress(stderr)) if show_progress else None
        image = pull(source, store, options, progress)
    for warning in image.warnings:
        stderr.print(f"warning: {escape(warning)}")
    if json_output:
        _print_json(_pulled_json(image, settings.cache))
        return
    if not quiet:
        stderr.print(
            f"pulled {escape(image.name)} ({image.platform}, {len(image.layers)} layers, "
            f"{_size(image.size)}; fetched {_size(image.fetched_bytes)}, "
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
        stdout.print(f"  layer {n}:{'':<3}{layer.digest}  {_size(layer.size):>10}  "
                     f"{layer.media_type}")
    stdout.print(f"  total:      {_size(report.compressed_size)} in {len(report.layers)} layers")


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
    _setup_logging(verbose)
    source = parse_reference(ref)
    settings = _settings(cache, insecure_registry, mirror, ca_file, None)
    report = inspect_image(source, Store.open(settings.cache), _pull_options(settings, platform))
    if json_output:
        _print_json(report.to_json())
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
    gpus: Annotated[str | None, typer.Option(
        "--gpus", metavar="all|IDS", help="Expose NVIDIA GPUs (prestart hook + CDI "
                                          "annotation).")] = None,
    cache: CacheOpt = None,
    platform: PlatformOpt = None,
    insecure_registry: InsecureOpt = None,
    mirror: MirrorOpt = None,
    ca_file: CaFileOpt = None,
    jobs: JobsOpt = None,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Make a rootless OCI bundle (rootfs/ + config.json) from an image; print its path."""
    _setup_logging(verbose)
    source = parse_reference(ref)
    settings = _settings(cache, insecure_registry, mirror, ca_file, jobs)
    store = Store.open(settings.cache)
    config_options = ConfigOptions(
        rootless=rootless, args=cmd or None, entrypoint=entrypoint or None, env=env or (),
        mounts=mount or (), readonly=readonly, hostname=hostname, gpus=gpus,
        map_root=map_root)
    show_progress = stderr.is_terminal and not quiet and not json_output
    with contextlib.ExitStack() as stack:
        progress = stack.enter_context(RichPullProgress(stderr)) if show_progress else None
        result = make_bundle(source, store, dest, pull_options=_pull_options(settings, platform),
                             config_options=config_options, progress=progress)
    for warning in result.warnings:
        stderr.print(f"warning: {escape(warning)}")
    if json_output:
        _print_json({"path": str(result.path), "reused": result.reused,
                     "image": _pulled_json(result.image, settings.cache)})
        return
    if not quiet:
        verb = "reused" if result.reused else "made"
        stderr.print(f"{verb} bundle of {escape(result.image.name)} "
                     f"({result.image.platform}, {len(result.image.layers)} layers)")
    stdout.print(str(result.path))


@app.command("stage")
def stage_command(
    what: Annotated[str, typer.Argument(metavar="REF|BUNDLE")],
    to: Annotated[str, typer.Option("--to", metavar="TARGET")],
) -> None:
    """Stage a bundle onto a shared or node-local target; print the staged path."""
    _not_implemented("stage")


@app.command("unstage")
def unstage_command(path: Annotated[Path, typer.Argument()]) -> None:
    """Remove a staged bundle (and its lease) safely."""
    _not_implemented("unstage")


@app.command("submit", context_settings={"allow_extra_args": True,
                                         "ignore_unknown_options": True})
def submit_command(ref: RefArg, ctx: typer.Context) -> None:
    """Pull, bundle and stage REF, then `sbatch --container` it: submit REF [sbatch opts] -- CMD."""
    _not_implemented("submit")


@cache_app.command("ls")
def cache_ls() -> None:
    """List cached images with sizes, last use and leases."""
    _not_implemented("cache ls")


@cache_app.command("du")
def cache_du() -> None:
    """Show the cache's logical and on-disk size."""
    _not_implemented("cache du")


@cache_app.command("gc")
def cache_gc() -> None:
    """Remove unreferenced and least recently used content."""
    _not_implemented("cache gc")


@cache_app.command("verify")
def cache_verify() -> None:
    """Re-hash cached content; report and quarantine corrupt entries."""
    _not_implemented("cache verify")


@cache_app.command("rm")
def cache_rm(ref: RefArg) -> None:
    """Remove an image from the cache."""
    _not_implemented("cache rm")


@runtime_app.command("oci-conf")
def runtime_oci_conf() -> None:
    """Print an oci.conf for Slurm for a given runtime (runc, crun, nvidia, ...)."""
    _not_implemented("runtime oci-conf")


@runtime_app.command("scrun-lua")
def runtime_scrun_lua() -> None:
    """Print a scrun.lua whose stage hooks call `ocistage scrun ...`."""
    _not_implemented("runtime scrun-lua")


@scrun_app.command("stage-in")
def scrun_stage_in() -> None:
    """Stage-in entry point called by scrun.lua."""
    _not_implemented("scrun stage-in")


@scrun_app.command("stage-out")
def scrun_stage_out() -> None:
    """Stage-out entry point called by scrun.lua."""
    _not_implemented("scrun stage-out")


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
