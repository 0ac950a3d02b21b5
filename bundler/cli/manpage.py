"""``ocistage(1)``: the manual page, made from the commands' own ``--help`` (``make man``).
The roff writing here serves ``ocistage-pyxis-importer(1)`` too (ocistage.bundler.pyxis.manpage).

Nothing here is written twice: the page is ``ocistage --help`` and every command's and
sub-command's ``--help`` (usage, description, options, examples) as click formats them at 80
columns, each under its own heading, with the exit statuses and the environment of
docs/cli.md and docs/config.md. ``python -m ocistage.bundler.cli.manpage [-o FILE]`` prints it
(or writes FILE); ``make man`` puts it where ``man ocistage`` finds it.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer

from ocistage.errors import UsageError

#: what ``man ocistage`` says besides the help texts (docs/cli.md, docs/config.md)
EXIT_STATUS = (
    ("0", "success"),
    ("1", "an operational error (network, registry, digest, disk, permissions, Slurm), or an "
          "internal error"),
    ("2", "a usage error: a malformed option, reference or config file value, or a path on "
          "the command line that cannot be right"),
    ("130", "interrupted (Ctrl-C, SIGTERM, SIGHUP)"),
    ("141", "stdout was closed by its reader (ocistage cache ls | head -1), as SIGPIPE ends "
            "ls"),
)
ENVIRONMENT = (
    ("OCISTAGE_CACHE", "the cache directory (--cache)"),
    ("OCISTAGE_STAGE_TO", "where stage and submit stage to (--to, --stage-to)"),
    ("OCISTAGE_PULL", "always, missing or never (--pull)"),
    ("OCISTAGE_INSECURE_REGISTRIES", "registries reached over plain HTTP or unverified TLS, "
                                     "comma-separated (--insecure-registry)"),
    ("OCISTAGE_CONFIG", "the user's config file [default: ~/.config/ocistage/config.toml]"),
)


#: a page of a version on a date
Renderer = Callable[[str, datetime.date], str]


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command below ``command`` (a click group), depth first, in ``--help``'s order,
    with the words that name it: ``("cache", "gc")``."""
    for name in command.list_commands(None):
        sub = command.get_command(None, name)
        if sub is None or sub.hidden:
            continue
        yield (*path, name), sub
        if hasattr(sub, "list_commands"):
            yield from commands(sub, (*path, name))


def help_text(command: Any, words: tuple[str, ...]) -> str:
    """What ``ocistage WORDS --help`` prints, at 80 columns."""
    ctx = command.make_context(" ".join(("ocistage", *words)), [], resilient_parsing=True,
                               terminal_width=80, max_content_width=80)
    return str(command.get_help(ctx))


def roff(text: str) -> str:
    """``text`` as lines roff shows as they are (in a ``.nf`` block): each backslash as
    ``\\e``, a line that would be a request (``.`` or ``'`` first) behind ``\\&``; lines are
    split at newlines only. A character roff cannot show (a control character other than a
    tab, a non-UTF-8 byte) is refused: groff drops it without a word."""
    bad = next((c for c in text if not (c.isprintable() or c in "\t\n")), None)
    if bad is not None:
        raise UsageError(f"the man page cannot show {bad!r} (in {text[:60]!r})",
                         "remove it from the help text")
    lines = text.replace("\\", "\\e").split("\n")
    if lines[-1] == "":
        lines.pop()
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in lines)


def section(title: str, body: str) -> str:
    return f".SH {title}\n.nf\n{roff(body)}\n.fi\n"


def table(title: str, rows: tuple[tuple[str, str], ...]) -> str:
    """A section of ``.TP`` paragraphs: each name in bold, its text below."""
    return f".SH {title}\n" + "".join(f".TP\n.B {roff(name)}\n{roff(text)}\n"
                                       for name, text in rows)


def render(version: str, date: datetime.date) -> str:
    """The page: NAME, SYNOPSIS, DESCRIPTION (``ocistage --help``), COMMANDS (each command's
    help), EXIT STATUS, ENVIRONMENT, FILES, SEE ALSO."""
    from ocistage.bundler.cli.app import app

    root = typer.main.get_command(app)
    parts = [f'.TH OCISTAGE 1 "{date.isoformat()}" "ocistage {version}" "User Commands"\n',
             ".SH NAME\nocistage \\- registry images to rootless OCI bundles, staged where "
             "Slurm jobs run\n",
             ".SH SYNOPSIS\n.B ocistage\n[\\fB\\-\\-version\\fR] [\\fB\\-h\\fR] "
             "\\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGS\\fR]...\n",
             section("DESCRIPTION", help_text(root, ())),
             ".SH COMMANDS\n"]
    for words, command in commands(root):
        parts.append(f".SS ocistage {' '.join(words)}\n.nf\n"
                     f"{roff(help_text(command, words))}\n.fi\n")
    parts.append(".SH EXIT STATUS\n" + "".join(
        f".TP\n.B {code}\n{roff(text)}\n" for code, text in EXIT_STATUS))
    parts.append(".SH ENVIRONMENT\n" + "".join(
        f".TP\n.B {name}\n{roff(text)}\n" for name, text in ENVIRONMENT))
    parts.append(".SH FILES\n.TP\n.B /etc/ocistage/config.toml\nthe site's settings\n"
                 ".TP\n.B ~/.config/ocistage/config.toml\nthe user's settings, over the "
                 "site's (ocistage config show)\n")
    parts.append(".SH SEE ALSO\n.BR ocistage-pyxis-importer (1),\n.BR runc (8),\n.BR crun (1),\n"
                 ".BR skopeo (1),\n.BR sbatch (1),\n.BR scrun (1)\n")
    return "".join(parts)


def main(argv: list[str] | None = None, render_page: Renderer | None = None,
         prog: str = "python -m ocistage.bundler.cli.manpage") -> int:
    """Print (or write, ``-o FILE``) the page ``render_page`` makes, ocistage(1) by default."""
    parser = argparse.ArgumentParser(prog=prog, description="Print (or write) the manual page.")
    parser.add_argument("-o", "--output", type=Path, help="write the page to this file")
    args = parser.parse_args(argv)
    from ocistage import __version__

    page = (render_page or render)(__version__, datetime.date.today())
    if args.output is None:
        sys.stdout.write(page)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
