"""What every command module of the CLI shares: consoles, option types, small renderers.

Every ``ocistage`` command line imports this module and the command modules, so they import
only typer and rich at the top: the library modules (and requests, jsonschema, ... behind
them) are imported inside the functions that use them. ``tests/bundler/test_cli_imports.py``
checks that ``--help`` and the light commands stay free of them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from cache.errors import NotImplementedYet

if TYPE_CHECKING:
    from bundler.pull import PullOptions, PullProgress
    from bundler.settings import Settings

# piped output is for grep and scripts: wide enough that table rows do not wrap
stdout = Console(soft_wrap=True, highlight=False,
                 width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 240)
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
PullOpt = Annotated[str | None, typer.Option(
    "--pull", metavar="always|missing|never",
    help="always: ask the registry for the reference; missing: use a complete cached copy "
         "as is, without the network; never: the cache only [default: always; also "
         "$OCISTAGE_PULL, `pull` in the config file].")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress, only the result.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log what happens (stderr).")]


def settings_from(cache: Path | None, insecure: list[str] | None, mirror: list[str] | None,
              ca_file: Path | None, jobs: int | None, pull: str | None = None) -> Settings:
    from bundler.settings import load_settings

    return load_settings(cache=cache, jobs=jobs, ca_file=str(ca_file) if ca_file else None,
                         insecure=insecure or (), mirrors=mirror or (), pull=pull)


def pull_options(settings: Settings, platform: str | None) -> PullOptions:
    from bundler.platform import Platform
    from bundler.pull import PullOptions

    return PullOptions(platform=Platform.parse(platform) if platform else None,
                       jobs=settings.jobs, registry=settings.registry_config(),
                       max_size=settings.max_size, policy=settings.pull,
                       unpack_limit=settings.unpack_limit)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@contextlib.contextmanager
def download_progress(quiet: bool) -> Iterator[PullProgress | None]:
    """Progress bars on stderr while downloading, when stderr is a terminal and not ``quiet``;
    a line per registry retry on stderr unless ``quiet``."""
    if quiet:
        yield None
        return
    from bundler.progress import RichPullProgress, retry_notices

    with retry_notices(stderr):
        if not stderr.is_terminal:
            yield None
            return
        with RichPullProgress(stderr) as progress:
            yield progress


def print_warnings(warnings: Iterable[str]) -> None:
    for warning in warnings:
        stderr.print(f"warning: {escape(warning)}")


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def human_size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def not_implemented(command: str) -> NoReturn:
    raise NotImplementedYet(f"`ocistage {command}` is not implemented yet")
