"""``ocistage-pyxis-importer(1)``: the manual page of pyxis's importer (its usage line is
the importer's own).

``python -m ocistage.bundler.pyxis.manpage [-o FILE]`` prints it (or writes FILE); ``make man``
puts it beside ocistage(1).
"""

from __future__ import annotations

import datetime
import sys

from ocistage.bundler.cli.manpage import main as write_page
from ocistage.bundler.cli.manpage import roff, section, table
from ocistage.bundler.pyxis.main import USAGE

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
    ("release", "end this job step's hold on its images (they stay until cache gc); like "
                "get, first drop what this user's killed gets left on this host"),
)
IMPORTER_ENVIRONMENT = (
    ("OCISTAGE_CACHE", "the cache the image is pulled into (else cache in a config file, "
                       "else ~/.cache/ocistage)"),
    ("OCISTAGE_PYXIS_STORE", "the site's store of squashfs images (pyxis_store), used when "
                             "the user may write it or the site filled it"),
    ("OCISTAGE_PYXIS_SQUASHFS_ONLY", "1: drop the layers a get pulled once its squashfs "
                                     "is made (pyxis_squashfs_only)"),
    ("OCISTAGE_PYXIS_COMPRESSION", "the compression of the images a get makes, e.g. zstd:3, "
                                   "lz4 (pyxis_compression) [default: zstd:6, else gzip:6]"),
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


def render(version: str, date: datetime.date) -> str:
    """ocistage-pyxis-importer(1): NAME, SYNOPSIS, DESCRIPTION, COMMANDS, ENVIRONMENT, FILES,
    EXIT STATUS, SEE ALSO."""
    return "".join([
        f'.TH OCISTAGE-PYXIS-IMPORTER 1 "{date.isoformat()}" "ocistage {version}" '
        '"User Commands"\n',
        ".SH NAME\nocistage-pyxis-importer \\- pyxis's image importer: squashfs images from "
        "ocistage's cache\n",
        section("SYNOPSIS", "\n".join(line.strip()
                                         for line in USAGE.replace("usage: ", "", 1).splitlines())),
        section("DESCRIPTION", IMPORTER_DESCRIPTION),
        ".SH PLUGSTACK\n.nf\n" + roff(
            "required /usr/lib/slurm/spank_pyxis.so "
            "importer=/opt/ocistage/venv/bin/ocistage-pyxis-importer use_squashfuse=1") +
        "\n.fi\nThe importer and its venv must be readable and executable by every user; "
        "slurmd's PATH must hold mksquashfs and enroot's bin/.\n",
        table("COMMANDS", IMPORTER_COMMANDS),
        table("ENVIRONMENT", IMPORTER_ENVIRONMENT),
        ".SH FILES\n.TP\n.B /etc/ocistage/config.toml\nthe site's settings (pyxis_store, "
        "registries, mirrors)\n.TP\n.B ~/.config/ocistage/config.toml\nthe user's settings, "
        "over the site's\n",
        table("EXIT STATUS", IMPORTER_EXIT_STATUS),
        ".SH SEE ALSO\n.BR ocistage (1),\n.BR enroot (1),\n.BR srun (1),\n"
        ".BR spank (8)\n"])


def main(argv: list[str] | None = None) -> int:
    return write_page(argv, render, prog="python -m ocistage.bundler.pyxis.manpage")


if __name__ == "__main__":
    sys.exit(main())
