"""``ocistage(1)``: the manual page, made from the commands' own ``--help`` (``make man``),
and ``ocistage-pyxis-importer(1)``, the page of pyxis's importer (its usage line is the
importer's own).

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
from collections.abc import Iterator
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


def _roff(text: str) -> str:
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


def _section(title: str, body: str) -> str:
    return f".SH {title}\n.nf\n{_roff(body)}\n.fi\n"


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
             _section("DESCRIPTION", help_text(root, ())),
             ".SH COMMANDS\n"]
    for words, command in commands(root):
        parts.append(f".SS ocistage {' '.join(words)}\n.nf\n"
                     f"{_roff(help_text(command, words))}\n.fi\n")
    parts.append(".SH EXIT STATUS\n" + "".join(
        f".TP\n.B {code}\n{_roff(text)}\n" for code, text in EXIT_STATUS))
    parts.append(".SH ENVIRONMENT\n" + "".join(
        f".TP\n.B {name}\n{_roff(text)}\n" for name, text in ENVIRONMENT))
    parts.append(".SH FILES\n.TP\n.B /etc/ocistage/config.toml\nthe site's settings\n"
                 ".TP\n.B ~/.config/ocistage/config.toml\nthe user's settings, over the "
                 "site's (ocistage config show)\n")
    parts.append(".SH SEE ALSO\n.BR ocistage-pyxis-importer (1),\n.BR runc (8),\n.BR crun (1),\n"
                 ".BR skopeo (1),\n.BR sbatch (1),\n.BR scrun (1)\n")
    return "".join(parts)


#: ocistage-pyxis-importer(1): what pyxis runs and what the importer reads (docs/pyxis.md)
IMPORTER_DESCRIPTION = """\
pyxis (NVIDIA's SPANK plugin behind srun --container-image) runs it as the job user
when the site's plugstack.conf names it (importer=PATH). For an image named the way
enroot names it, get prints the path of a squashfs image made from ocistage's cache
(pulled once per cache, one image per manifest digest, shared by every job, rank and
node that uses the cache), held for the job step until release. pyxis passes no
options: everything comes from the job's environment and the config files.
"""
IMPORTER_COMMANDS = (
    ("get docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]",
     "print the squashfs image's path (pulled and made if it is not there), held for this "
     "job step (SLURM_JOB_ID, SLURM_STEP_ID)"),
    ("release", "end this job step's hold on its images (they stay until cache gc)"),
)
IMPORTER_ENVIRONMENT = (
    ("OCISTAGE_CACHE", "the cache the image is pulled into (else cache in a config file, "
                       "else ~/.cache/ocistage)"),
    ("OCISTAGE_PYXIS_STORE", "the site's store of squashfs images (pyxis_store), used when "
                             "the user may write it or the site filled it"),
    ("OCISTAGE_PULL", "always, missing (the importer's default) or never"),
    ("OCISTAGE_INSECURE_REGISTRIES", "registries reached over plain HTTP or unverified TLS, "
                                     "comma-separated"),
    ("OCISTAGE_CA_FILE", "an extra CA bundle (PEM) for HTTPS registries"),
    ("OCISTAGE_CONFIG", "the user's config file [default: ~/.config/ocistage/config.toml]"),
    ("ENROOT_CONFIG_PATH", "where enroot's .credentials (netrc) is read [default: "
                           "~/.config/enroot]"),
    ("REGISTRY_AUTH_FILE, DOCKER_CONFIG", "credential files, as for ocistage pull"),
    ("SLURM_JOB_ID, SLURM_STEP_ID", "the job step holding the image (set by Slurm)"),
)
IMPORTER_EXIT_STATUS = (
    ("0", "success: get printed the image's path"),
    ("1", "an operational error (registry, digest, disk, permissions): one error: and one "
          "hint: line on stderr, which pyxis shows"),
    ("2", "a command line pyxis would not give"),
    ("130", "interrupted (SIGTERM of a cancelled step, SIGHUP, Ctrl-C)"),
)


def _table(title: str, rows: tuple[tuple[str, str], ...]) -> str:
    return f".SH {title}\n" + "".join(f".TP\n.B {_roff(name)}\n{_roff(text)}\n"
                                       for name, text in rows)


def render_importer(version: str, date: datetime.date) -> str:
    """ocistage-pyxis-importer(1): NAME, SYNOPSIS, DESCRIPTION, COMMANDS, ENVIRONMENT, FILES,
    EXIT STATUS, SEE ALSO."""
    from ocistage.bundler.cli.pyxis import USAGE

    return "".join([
        f'.TH OCISTAGE-PYXIS-IMPORTER 1 "{date.isoformat()}" "ocistage {version}" '
        '"User Commands"\n',
        ".SH NAME\nocistage-pyxis-importer \\- pyxis's image importer: squashfs images from "
        "ocistage's cache\n",
        _section("SYNOPSIS", "\n".join(line.strip()
                                         for line in USAGE.replace("usage: ", "", 1).splitlines())),
        _section("DESCRIPTION", IMPORTER_DESCRIPTION),
        ".SH PLUGSTACK\n.nf\n" + _roff(
            "required /usr/lib/slurm/spank_pyxis.so "
            "importer=/opt/ocistage/venv/bin/ocistage-pyxis-importer use_squashfuse=1") +
        "\n.fi\nThe importer and its venv must be readable and executable by every user; "
        "slurmd's PATH must hold mksquashfs and enroot's bin/.\n",
        _table("COMMANDS", IMPORTER_COMMANDS),
        _table("ENVIRONMENT", IMPORTER_ENVIRONMENT),
        ".SH FILES\n.TP\n.B /etc/ocistage/config.toml\nthe site's settings (pyxis_store, "
        "registries, mirrors)\n.TP\n.B ~/.config/ocistage/config.toml\nthe user's settings, "
        "over the site's\n",
        _table("EXIT STATUS", IMPORTER_EXIT_STATUS),
        ".SH SEE ALSO\n.BR ocistage (1),\n.BR enroot (1),\n.BR srun (1),\n"
        ".BR spank (8)\n"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ocistage.bundler.cli.manpage",
                                     description="Print (or write) the ocistage(1) page, or "
                                                 "ocistage-pyxis-importer(1) with --importer.")
    parser.add_argument("-o", "--output", type=Path, help="write the page to this file")
    parser.add_argument("--importer", action="store_true",
                        help="the page of ocistage-pyxis-importer instead")
    args = parser.parse_args(argv)
    from ocistage import __version__

    render_page = render_importer if args.importer else render
    page = render_page(__version__, datetime.date.today())
    if args.output is None:
        sys.stdout.write(page)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
