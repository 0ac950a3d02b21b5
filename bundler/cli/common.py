"""What every command module of the CLI shares: consoles, option types, settings, renderers.

Every ``ocistage`` command line imports this module and the command modules, so they import
only typer and rich at the top: the library modules (and requests, jsonschema, ... behind
them) are imported inside the functions that use them. ``tests/bundler/test_cli_imports.py``
checks that ``--help`` and the light commands stay free of them.

A command reads: declare its own options, take the shared ones with :func:`with_options` (it is
handed them as one :class:`CommonOptions`), build its settings with
:meth:`CommonOptions.settings`, make one library call, and print what it returned with
:meth:`CommonOptions.emit`: the result's JSON (``to_json``) with --json, else its human form
(``render``, told to a :class:`CliRenderer`, which writes out control characters and escapes
markup); see ``ocistage.results``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from ocistage.bundler.cli.printable import sanitize

if TYPE_CHECKING:
    from rich.console import Console

    from ocistage.bundler.image.reference import ImageSource
    from ocistage.bundler.pull import PullOptions, PullProgress
    from ocistage.bundler.settings import Settings
    from ocistage.cache.notice import Notice
    from ocistage.cache.store import Store
    from ocistage.results import JsonResult, Result


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
            console = self._console = _console_class(Console)(**options)
        return console


def _console_class(base: type[Console]) -> type[Console]:
    """rich's ``Console`` whose broken pipe (stdout's reader gone) ends the command as the CLI
    ends it for any closed stdout (rich's own ends it with exit 1)."""

    class ClosingConsole(base):  # type: ignore[valid-type,misc]
        def on_broken_pipe(self) -> None:
            from ocistage.bundler.cli.failure import ClosedStdout

            self.quiet = True
            raise ClosedStdout

    return ClosingConsole


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


def examples(*lines: str) -> str:
    """A command's ``--help`` epilog: its examples, one command line each, not rewrapped
    (click leaves a paragraph that starts with ``\\b`` as it is)."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


# -- completion of values (``ocistage --install-completion``) -----------------------------------

#: the platforms images are commonly built for, as --platform takes them
PLATFORMS = ("linux/amd64", "linux/arm64", "linux/arm64/v8", "linux/arm/v7", "linux/arm/v6",
             "linux/386", "linux/ppc64le", "linux/s390x", "linux/riscv64")


def complete_words(*words: str) -> Callable[[str], list[str]]:
    """A completer of an option's value among ``words``."""
    def complete(incomplete: str) -> list[str]:
        return [word for word in words if word.startswith(incomplete)]

    return complete


def complete_cached_ref(ctx: typer.Context, incomplete: str) -> list[str]:
    """The references the cache holds (those ``cache ls`` lists), for a REF: of ``--cache``
    if it came before on the line, else of the settings; only those a shell can take as they
    are (:func:`offerable`). Nothing if the index cannot be read: a completion never fails,
    and never waits (a FIFO at ``index.json``)."""
    try:
        return [name for name in _cached_names(ctx.params.get("cache"))
                if name.startswith(incomplete) and offerable(name)]
    except Exception:
        return []


#: characters the shell gives a meaning to on a command line (quotes, expansions, globs,
#: separators, redirections, history, comments)
SHELL_SYNTAX = frozenset("\"'`$\\;&|<>()[]{}*?!#~^")


def offerable(word: str) -> bool:
    """Whether a completion may offer ``word``: bash's completion script splits the
    candidates at newlines and inserts each on the command line as it is (unquoted), zsh's
    evaluates them, and a list of candidates is printed to the terminal. So a word from the
    cache (a reference another member of a group-shared cache may have named) is offered only
    when every character is printable (no C0, DEL, C1 or format character: an ESC would
    reach the terminal), is no whitespace (bash would insert two words) and has no meaning
    to the shell (``$(...)`` would run when the line is). The others stay usable when typed.
    """
    return bool(word) and all(char.isprintable() and not char.isspace()
                              and char not in SHELL_SYNTAX for char in word)


def _cached_names(cache: Path | None) -> list[str]:
    from ocistage.cache.jsondoc import parse_json, read_document
    from ocistage.cache.refnames import record_name
    from ocistage.cache.store import INDEX_LIMIT

    root = cache if cache is not None else CommonOptions(quiet=True).settings().cache
    # one open: never through a symlink, never waiting on a FIFO, a regular file of its size
    document = parse_json(read_document(Path(root) / "index.json", INDEX_LIMIT, owners="group"))
    entries = document.get("manifests", []) if isinstance(document, dict) else []
    return sorted({name for entry in entries if isinstance(entry, dict)
                   and (name := record_name(entry)) is not None})


# -- shared options ----------------------------------------------------------------------------

RefArg = Annotated[str, typer.Argument(
    metavar="REF", autocompletion=complete_cached_ref,
    help="[docker://]registry/repo[:tag][@sha256:...], oci:PATH[:tag], "
         "oci-archive:FILE[:tag] or docker-archive:FILE[:name:tag]")]
CacheOpt = Annotated[Path | None, typer.Option(
    "--cache", metavar="DIR", envvar="OCISTAGE_CACHE", show_envvar=True,
    help="Cache directory [default: $XDG_CACHE_HOME/ocistage].")]
PlatformOpt = Annotated[str | None, typer.Option(
    "--platform", metavar="OS/ARCH[/VARIANT]", autocompletion=complete_words(*PLATFORMS),
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
    "--ca-file", metavar="FILE",
    help="Extra CA bundle (PEM) to verify HTTPS registries with [also $OCISTAGE_CA_FILE, "
         "`ca_file` in the config file].")]
JobsOpt = Annotated[int | None, typer.Option(
    "--jobs", "-j", min=1, max=64, help="Parallel blob downloads [default: 6].")]
PullOpt = Annotated[str | None, typer.Option(
    "--pull", metavar="always|missing|never",
    autocompletion=complete_words("always", "missing", "never"),
    help="always: ask the registry for the reference; missing: use a complete cached copy "
         "as is, without the network; never: the cache only [default: always; also "
         "$OCISTAGE_PULL, `pull` in the config file].")]
PolicyOpt = Annotated[Path | None, typer.Option(
    "--policy", metavar="FILE",
    help="The image policy (containers-policy.json(5)) every pull obeys [default: "
         "~/.config/containers/policy.json, else /etc/containers/policy.json; `policy` in "
         "the config file; ignored where the site makes its policy mandatory].")]
RegistriesDOpt = Annotated[Path | None, typer.Option(
    "--registries.d", metavar="DIR",
    help="Where image signatures are (containers-registries.d(5)) [default: "
         "~/.config/containers/registries.d, else /etc/containers/registries.d].")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
QuietOpt = Annotated[bool, typer.Option(
    "--quiet", "-q", help="No progress and no routine warnings, only the result.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log what happens (stderr).")]

# -- the option group: the shared options, declared once, handed to a command as one object ----

#: every shared option in the order a command's --help lists them (after the command's own)
_OPTIONS: dict[str, tuple[Any, Any]] = {
    "cache": (CacheOpt, None),
    "platform": (PlatformOpt, None),
    "insecure_registry": (InsecureOpt, None),
    "mirror": (MirrorOpt, None),
    "ca_file": (CaFileOpt, None),
    "jobs": (JobsOpt, None),
    "pull": (PullOpt, None),
    "policy": (PolicyOpt, None),
    "registries_d": (RegistriesDOpt, None),
    "json": (JsonOpt, False),
    "quiet": (QuietOpt, False),
    "verbose": (VerboseOpt, False),
}
#: the options of the commands that pull an image (pull, bundle)
PULLING = tuple(_OPTIONS)
#: ... of those that may pull one but pass --jobs on to something else (stage, submit)
STAGING = tuple(name for name in _OPTIONS if name != "jobs")


def shared_option_names() -> set[str]:
    """Every spelling of the shared options (``--cache``, ``-j``, ``--jobs``, ...)."""
    names: set[str] = set()
    for annotation, _default in _OPTIONS.values():
        for info in getattr(annotation, "__metadata__", ()):
            # in typer's Annotated form the first spelling is the OptionInfo's default
            first = getattr(info, "default", None)
            names.update([first] if isinstance(first, str) and first.startswith("-") else [])
            names.update(getattr(info, "param_decls", None) or ())
    return names


@dataclass(frozen=True)
class CommonOptions:
    """The shared options of a command line, as one value (those a command does not take keep
    their defaults). :func:`with_options` adds them to a command and hands it this."""

    cache: Path | None = None
    platform: str | None = None
    insecure_registry: tuple[str, ...] = ()
    mirror: tuple[str, ...] = ()
    ca_file: Path | None = None
    jobs: int | None = None
    pull: str | None = None
    policy: Path | None = None
    registries_d: Path | None = None
    json: bool = False
    quiet: bool = False
    verbose: bool = False

    def settings(self, *, max_size: str | None = None,
                 keep_snapshot: bool | None = None) -> Settings:
        """The settings of the command: its options over environment, config files and
        defaults. The config files' warnings (unknown keys) are printed here."""
        from ocistage.bundler.settings import load_settings

        settings = load_settings(cache=self.cache, jobs=self.jobs,
                                 ca_file=str(self.ca_file) if self.ca_file else None,
                                 insecure=self.insecure_registry, mirrors=self.mirror,
                                 pull=self.pull, max_size=max_size, keep_snapshot=keep_snapshot,
                                 policy_file=str(self.policy) if self.policy else None,
                                 registries_d=str(self.registries_d) if self.registries_d
                                 else None)
        print_warnings(settings.warnings, self.quiet)
        return settings

    def store(self, settings: Settings | None = None) -> Store:
        """The cache of ``settings`` (made from the options if not given), opened."""
        from ocistage.cache.store import Store

        store = Store.open((settings or self.settings()).cache)
        print_warnings(store.notices)
        return store

    def pull_options(self, settings: Settings) -> PullOptions:
        from ocistage.bundler.image.platform import Platform
        from ocistage.bundler.pull import PullOptions

        return PullOptions(platform=Platform.parse(self.platform) if self.platform else None,
                           jobs=settings.jobs, registry=settings.registry_config(),
                           max_size=settings.max_size, policy=settings.pull,
                           unpack_limit=settings.unpack_limit, trust=settings.trust_config())

    def image_inputs(self, ref: str,
                     settings: Settings) -> tuple[ImageSource, Store, PullOptions]:
        """What pull, bundle, inspect and submit take: the parsed REF, the cache, the pull
        options."""
        from ocistage.bundler.image.reference import parse_reference

        return parse_reference(ref), self.store(settings), self.pull_options(settings)

    def progress(self) -> contextlib.AbstractContextManager[PullProgress | None]:
        """Download progress on stderr, unless --quiet or --json (:func:`download_progress`)."""
        return download_progress(self.quiet or self.json)

    def emit(self, result: Result, *, rich: bool = False, one_line: bool = False) -> None:
        """``result`` as the command prints it: its JSON with --json (one line with
        ``one_line``), else its human form, through rich if ``rich`` (else plain lines,
        without loading rich)."""
        if self.json or one_line:
            print_json(result.to_json(), one_line=one_line)
        else:
            result.render(CliRenderer(quiet=self.quiet, rich=rich))


def with_options(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the shared options ``names`` (keys of :class:`CommonOptions`) to a command.

    The command declares its own options and a last parameter ``opts: CommonOptions``; the
    function typer sees has the command's own options, then the shared ones in one order
    (that of :data:`_OPTIONS`), and calls the command with them gathered in ``opts`` (after
    setting up logging when it takes --verbose)::

        @pull_app.command("pull")
        @with_options(*PULLING)
        def pull_command(ref: RefArg, opts: CommonOptions) -> None: ...
    """
    unknown = set(names) - set(_OPTIONS)
    if unknown:
        raise ValueError(f"no shared options {sorted(unknown)}")
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                annotation=annotation)
              for name, (annotation, default) in _OPTIONS.items() if name in names]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "opts"]
        if len(own) == len(signature.parameters):
            raise TypeError(f"{command.__name__} takes no opts: CommonOptions")
        if {p.name for p in own} & set(names):
            raise TypeError(f"{command.__name__} declares a shared option of its own")

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            given: dict[str, Any] = {p.name: kwargs.pop(p.name) for p in shared}
            # an option not given keeps the field's default; repeated ones arrive as lists
            values: dict[str, Any] = {name: tuple(value) if isinstance(value, list) else value
                                      for name, value in given.items() if value is not None}
            opts = CommonOptions(**values)
            if "verbose" in given:
                setup_logging(opts.verbose)
            return command(*args, opts=opts, **kwargs)

        parameters = [*own, *shared]
        run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {**{p.name: p.annotation for p in parameters},
                               "return": signature.return_annotation}
        return run

    return decorate


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


def print_json(value: Any, *, one_line: bool = False) -> None:
    """``value`` as indented JSON on stdout (non-ASCII and control characters escaped), or as
    one line (``one_line``: a line per result, for a script that reads lines)."""
    sys.stdout.write(json.dumps(value, indent=None if one_line else 2) + "\n")


def print_json_line(result: JsonResult) -> None:
    """A result that is only JSON as one line on stdout (what the scrun hooks read)."""
    print_json(result.to_json(), one_line=True)


class CliRenderer:
    """The command line's :class:`ocistage.results.Renderer`: a result's human form on
    stdout and stderr. Every text has its control characters written out; with ``rich`` it is
    printed through rich (markup escaped), else as a plain line without loading rich (the
    routine commands: pull, bundle, stage, unstage). ``quiet`` leaves out notes and details."""

    def __init__(self, *, quiet: bool = False, rich: bool = False) -> None:
        self.quiet = quiet
        self.rich = rich

    def _print(self, text: str, *, err: bool = False, style: str = "") -> None:
        if not self.rich:
            echo(text, err=err)
            return
        markup = shown(text)
        (stderr if err else stdout).print(f"[{style}]{markup}[/{style}]" if style and markup
                                          else markup)

    def line(self, text: str = "", *, faint: str = "") -> None:
        if faint and self.rich:
            stdout.print(shown(text) + f"[dim]{shown(faint)}[/dim]")
        else:
            self._print(text + faint)

    def detail(self, text: str) -> None:
        if not self.quiet:
            self._print(text)

    def heading(self, text: str) -> None:
        self._print(text, style="bold")

    def note(self, text: str) -> None:
        if not self.quiet:
            self._print(text, err=True)

    def warning(self, text: str) -> None:
        self._print(f"warning: {text}", err=True)

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[str]], *,
              title: str | None = None, right: Collection[str] = (),
              names_last: bool = True) -> None:
        from rich.table import Table

        table = Table(title=title, title_justify="left", box=None, pad_edge=False)
        for column in columns:
            justify = "right" if column in right else "left"
            if not names_last:
                table.add_column(column, justify=justify)  # type: ignore[arg-type]
                continue
            last = column == columns[-1]
            table.add_column(column, justify=justify,  # type: ignore[arg-type]
                             overflow="fold", no_wrap=not last, min_width=24 if last else None)
        for row in rows:
            table.add_row(*map(shown, row))
        stdout.print(table)
