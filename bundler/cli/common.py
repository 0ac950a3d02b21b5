"""What every command module of the CLI shares: consoles, option types, settings, renderers.

Every ``ocistage`` command line imports this module and the command modules, so they import
only typer and rich at the top: the library modules (and requests, jsonschema, ... behind
them) are imported inside the functions that use them. ``tests/bundler/test_cli_imports.py``
checks that ``--help`` and the light commands stay free of them.

A command reads: declare its options with the types below, build its settings with
:func:`load_cli_settings`, make one library call, render the result (:func:`print_json` for
``--json``; :func:`shown` around every string that came from outside before it is printed).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from ocistage.bundler.image.reference import ImageSource
    from ocistage.bundler.pull import PullOptions, PullProgress
    from ocistage.bundler.settings import Settings
    from ocistage.cache.notice import Notice
    from ocistage.cache.store import Store


class _LazyConsole:
    """A rich ``Console`` made on first use: rich's import (~20 ms here) is paid by the
    commands that print through it, not by every command line (``--version``, ``scrun
    stage-in``, a warm ``bundle`` print with :func:`echo`)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.made(), name)

    def made(self) -> Console:
        """The console itself, made now if it was not yet: what is handed to rich (a
        ``Progress`` enters it as a context manager, which no attribute lookup reaches)."""
        console = self.__dict__.get("_console")
        if console is None:
            from rich.console import Console

            options = dict(self._options)
            if options.pop("wide_when_piped", False):
                # piped output is for grep and scripts: wide enough that table rows do not wrap
                options["width"] = (None if sys.stdout.isatty() or os.environ.get("COLUMNS")
                                    else 240)
            console = self._console = Console(**options)
        return console


_STDOUT = _LazyConsole(soft_wrap=True, highlight=False, wide_when_piped=True)
_STDERR = _LazyConsole(stderr=True, soft_wrap=True, highlight=False)
#: for ``print`` and the like; a rich object that takes a console gets :func:`console`'s
stdout = cast("Console", _STDOUT)
stderr = cast("Console", _STDERR)


def console(err: bool = True) -> Console:
    """The rich console of stderr (or stdout) itself, made now if needed."""
    return (_STDERR if err else _STDOUT).made()


def echo(text: str, *, err: bool = False) -> None:
    """One line of plain text on stdout (or stderr), control characters written out; no
    markup and no rich (for the lines a routine command prints)."""
    stream = sys.stderr if err else sys.stdout
    stream.write(sanitize(text) + "\n")


def is_terminal(err: bool = True) -> bool:
    """Whether stderr (or stdout) is a terminal, as rich decides it; rich is not loaded for
    a stream that is no terminal and no ``FORCE_COLOR``/``TTY_COMPATIBLE`` says otherwise."""
    stream = sys.stderr if err else sys.stdout
    try:
        plain = not stream.isatty()
    except (AttributeError, ValueError):
        plain = True
    if plain and not (os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE")):
        return False
    return bool(console(err).is_terminal)


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
QuietOpt = Annotated[bool, typer.Option(
    "--quiet", "-q", help="No progress and no routine warnings, only the result.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log what happens (stderr).")]

# -- settings and the inputs of an image command -----------------------------------------------


def load_cli_settings(*, cache: Path | None = None, insecure: list[str] | None = None,
                      mirror: list[str] | None = None, ca_file: Path | None = None,
                      jobs: int | None = None, pull: str | None = None,
                      max_size: str | None = None,
                      keep_snapshot: bool | None = None) -> Settings:
    """The settings of a command: its options over environment, config files and defaults.

    The config files' warnings (unknown keys) are printed here.
    """
    from ocistage.bundler.settings import load_settings

    settings = load_settings(cache=cache, jobs=jobs, ca_file=str(ca_file) if ca_file else None,
                             insecure=insecure or (), mirrors=mirror or (), pull=pull,
                             max_size=max_size, keep_snapshot=keep_snapshot)
    print_warnings(settings.warnings)
    return settings


def open_store(settings: Settings) -> Store:
    from ocistage.cache.store import Store

    return Store.open(settings.cache)


def image_inputs(ref: str, settings: Settings,
                 platform: str | None) -> tuple[ImageSource, Store, PullOptions]:
    """What pull, bundle and inspect take: the parsed REF, the cache, the pull options."""
    from ocistage.bundler.image.reference import parse_reference

    source = parse_reference(ref)
    return source, open_store(settings), pull_options(settings, platform)


def pull_options(settings: Settings, platform: str | None) -> PullOptions:
    from ocistage.bundler.image.platform import Platform
    from ocistage.bundler.pull import PullOptions

    return PullOptions(platform=Platform.parse(platform) if platform else None,
                       jobs=settings.jobs, registry=settings.registry_config(),
                       max_size=settings.max_size, policy=settings.pull,
                       unpack_limit=settings.unpack_limit)


class _SanitizingFormatter(logging.Formatter):
    """Log lines quote registries and images too: their control characters written out."""

    def format(self, record: logging.LogRecord) -> str:
        return sanitize(super().format(record))


def setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_SanitizingFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        handlers=[handler])


@contextlib.contextmanager
def download_progress(quiet: bool) -> Iterator[PullProgress | None]:
    """Progress bars on stderr while downloading, when stderr is a terminal and not ``quiet``;
    a line per registry retry on stderr unless ``quiet``."""
    if quiet:
        yield None
        return
    from ocistage.bundler.progress import RichPullProgress, retry_notices

    with retry_notices(stderr):  # prints through it only on a retry: made then
        if not is_terminal():
            yield None
            return
        with RichPullProgress(console()) as progress:
            yield progress


# -- rendering ---------------------------------------------------------------------------------

# C0 controls but newline and tab, DEL, C1 controls, and the bidirectional overrides and
# isolates that reorder what a terminal shows
_UNPRINTABLE_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def sanitize(text: str) -> str:
    r"""``text`` with control characters written out (``\x1b``), safe to print on a terminal.

    Registry error messages, image config values and names from images reach the user's
    terminal; an escape sequence in them must not move the cursor, set the title or hide text.
    """
    return _UNPRINTABLE_RE.sub(lambda m: (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                          else f"\\u{ord(m.group()):04x}"), text)


def shown(text: object) -> str:
    """``text`` ready for a rich ``print``: control characters written out, markup escaped."""
    from rich.markup import escape

    return escape(sanitize(str(text)))


def summarize_warnings(warnings: Iterable[Notice], quiet: bool = False) -> list[str]:
    """The warnings to print: device nodes replaced by empty files become one line, none if
    ``quiet`` (they are expected of every image with a /dev, and the runtime provides /dev)."""
    from ocistage.cache.notice import Kind  # light commands print no warnings

    kept: list[str] = []
    devices = 0
    for warning in warnings:
        if warning.kind is Kind.DEVICE_NODE:
            devices += 1
        else:
            kept.append(str(warning))
    if devices and not quiet:
        kept.append(f"{devices} device node{'s' if devices != 1 else ''} (as under /dev) "
                    "replaced by empty files: a rootless bundle cannot hold them "
                    "(the runtime provides /dev)")
    return kept


def print_warnings(warnings: Iterable[Notice], quiet: bool = False) -> None:
    for warning in summarize_warnings(warnings, quiet):
        echo(f"warning: {warning}", err=True)


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout (non-ASCII and control characters escaped)."""
    sys.stdout.write(json.dumps(value, indent=2) + "\n")
