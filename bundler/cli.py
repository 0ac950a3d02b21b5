"""The ``ocistage`` command line: parse options, call library functions, render results.

This is the only module that imports all four packages. The commands of the groups live in
``cli_cache``, ``cli_config``, ``cli_stage`` and ``cli_slurm``, each attached by its
``register(app)``. :func:`run` is the one boundary between the library and the user: errors
from the library arrive as :class:`cache.errors.OcistageError` and are rendered as one
``error:`` line plus a ``hint:`` line (exit 1, or 2 for usage errors); any other exception is
one line too; tracebacks are shown only with ``-v``.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bundler import cli_cache, cli_config, cli_slurm, cli_stage
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
    image_inputs,
    load_cli_settings,
    print_json,
    print_warnings,
    setup_logging,
    shown,
    stderr,
    stdout,
)
from cache.errors import OcistageError
from cache.sizes import format_size

if TYPE_CHECKING:
    from bundler.inspect import ImageReport
    from bundler.pull import PulledImage

# The library is imported inside the commands: each command line loads what it uses only
# (see bundler.cli_common).


def _version(value: bool) -> None:
    if value:
        # the package's own constant (pyproject reads it too): importlib.metadata would scan
        # site-packages, ~25 ms of every `ocistage --version`
        from bundler import __version__

        stdout.print(f"ocistage {__version__}", markup=False)
        raise typer.Exit()


app = typer.Typer(
    rich_markup_mode=None,
    name="ocistage",
    help="Registry images -> rootless OCI bundles -> staged where Slurm jobs run.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _main_options(
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_version, help="Print the version and exit.")
    ] = False,
) -> None:
    """Registry images -> rootless OCI bundles -> staged where Slurm jobs run."""


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
        stderr.print(
            f"pulled {shown(image.name)} ({image.platform}, {len(image.layers)} layers, "
            f"{format_size(image.size)}; fetched {format_size(image.fetched_bytes)}, "
            f"reused {image.reused_blobs} blobs)")
    stdout.print(str(image.manifest.digest))


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

    setup_logging(verbose)
    settings = load_cli_settings(cache=cache, insecure=insecure_registry, mirror=mirror,
                                 ca_file=ca_file)
    report = inspect_image(*image_inputs(ref, settings, platform))
    if json_output:
        print_json(report.to_json())
    else:
        _render_report(report)


# -- bundle ------------------------------------------------------------------------------------


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
    from bundler.runtime_config import ConfigOptions

    setup_logging(verbose)
    settings = load_cli_settings(cache=cache, insecure=insecure_registry, mirror=mirror,
                                 ca_file=ca_file, jobs=jobs, pull=pull_policy)
    source, store, options = image_inputs(ref, settings, platform)
    config_options = ConfigOptions(
        rootless=rootless, args=cmd or None, entrypoint=entrypoint or None, env=env or (),
        mounts=mount or (), readonly=readonly, hostname=hostname, gpus=gpus,
        map_root=map_root)
    with download_progress(quiet or json_output) as progress:
        result = make_bundle(source, store, dest, pull_options=options,
                             config_options=config_options, progress=progress, link=link)
    print_warnings(result.warnings, quiet)
    if json_output:
        print_json({"path": str(result.path), "reused": result.reused,
                    "warnings": list(result.warnings),
                    "image": _pulled_json(result.image, settings.cache)})
        return
    if not quiet:
        verb = "reused" if result.reused else "made"
        stderr.print(f"{verb} bundle of {shown(result.image.name)} "
                     f"({result.image.platform}, {len(result.image.layers)} layers)")
    stdout.print(str(result.path))


for _module in (cli_cache, cli_config, cli_stage, cli_slurm):
    _module.register(app)


# -- the boundary: every exception becomes one error line --------------------------------------


def render_error(message: str, hint: str | None) -> None:
    stderr.print(f"[bold red]error:[/bold red] {shown(message)}")
    if hint:
        stderr.print(f"[dim]hint:[/dim] {shown(hint)}")


def _os_error_text(error: OSError) -> str:
    text = error.strerror or str(error)
    names = [n for n in (error.filename, error.filename2) if n is not None]
    return f"{text}: {' -> '.join(map(str, names))}" if names else text


def _wants_traceback(argv: Sequence[str]) -> bool:
    options = argv[:list(argv).index("--")] if "--" in argv else argv
    return any(arg in ("-v", "--verbose") for arg in options)


#: click's base of command-line errors (vendored by typer 0.28 as typer._click, the click
#: package before): found through a public class, whichever it is
_CLICK_ERROR: type[Exception] = next(
    cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "ClickException")


def run(argv: Sequence[str]) -> int:
    """Run the command line ``argv`` (without the program name); return the exit status.

    The one place where exceptions become what the user sees: an :class:`OcistageError` is
    its message and hint (exit 1, 2 for usage errors), an ``OSError`` its strerror and path
    (exit 1), anything else an internal error (exit 1); the traceback only with ``-v``.
    A mistake on the command line itself (typer/click's usage errors) is rendered the same
    way: its message, and the command's usage as the hint (exit 2).
    """
    try:
        code = app(args=list(argv), prog_name="ocistage", standalone_mode=False)
    except SystemExit as done:  # shell completion and a closed stdout end so
        code = done.code
    except KeyboardInterrupt:
        code = 130
    except OcistageError as error:
        if _wants_traceback(argv):
            traceback.print_exc()
        render_error(error.message, error.hint)
        return error.exit_code
    except OSError as error:
        if _wants_traceback(argv):
            traceback.print_exc()
        render_error(_os_error_text(error), "rerun with -v for details")
        return 1
    except _CLICK_ERROR as error:
        return _render_usage_error(error, argv)
    except Exception as error:  # the boundary: no traceback unless asked
        if type(error).__name__ == "Abort":  # click's: end of input at a prompt
            render_error("aborted", None)
            return 1
        if _wants_traceback(argv):
            traceback.print_exc()
        render_error(f"internal error: {type(error).__name__}: {error}",
                     "this is a bug in ocistage; rerun with -v and report the traceback")
        return 1
    if code == 130:
        stderr.print("interrupted")
    return code if isinstance(code, int) else (0 if code is None else 1)


def _command_path(argv: Sequence[str]) -> str:
    """``ocistage cache gc`` for ``["cache", "gc", "--max-size"]``: the command words."""
    command: Any = typer.main.get_command(app)
    path = ["ocistage"]
    for word in argv:
        command = getattr(command, "commands", {}).get(word)
        if command is None:
            break
        path.append(word)
    return " ".join(path)


def _render_usage_error(error: Exception, argv: Sequence[str]) -> int:
    """click's usage error as ours: ``error:`` its message, ``hint:`` the command's usage."""
    ctx = getattr(error, "ctx", None)
    code = getattr(error, "exit_code", 2)
    if type(error).__name__ == "NoArgsIsHelpError" and ctx is not None:
        stderr.print(ctx.get_help(), markup=False, highlight=False)  # `ocistage cache`
        return int(code)
    message = str(getattr(error, "format_message", lambda: str(error))())
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    message = message.removesuffix(".")
    hint = None
    if ctx is not None:
        usage = " ".join(ctx.get_usage().split())
        usage = usage[len("Usage: "):] if usage.startswith("Usage: ") else usage
        hint = f"usage: {usage} ('{ctx.command_path} --help' for more)"
    else:  # raised by the parser before the command's context existed
        hint = f"'{_command_path(argv)} --help' shows the usage"
    render_error(message, hint)
    return int(code)


def main() -> None:
    code = run(sys.argv[1:])
    if code == 130 and _left_behind():
        # interrupted while a download thread was still connecting (a connect cannot be cut
        # short; bundler.pull.CANCEL_GRACE): end now, as after kill -9 what it leaves is
        # recovered (partial downloads are resumed, locks and leases of a dead pid expire)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _left_behind() -> bool:
    """Whether other threads still run: interpreter exit would wait for download workers
    (concurrent.futures joins its workers at exit, daemon threads or not)."""
    return any(thread.is_alive() for thread in threading.enumerate()
               if thread is not threading.main_thread())


if __name__ == "__main__":
    main()
