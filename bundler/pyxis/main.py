"""``ocistage-pyxis-importer``: pyxis's ``importer=`` (docs/pyxis.md).

    ocistage-pyxis-importer get docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]
    ocistage-pyxis-importer release

pyxis runs it as the job user with stdin closed and reads the first line of stdout (the image's
path); it shows stderr only when the exit status is not 0. So this prints nothing but the path
on success, and on failure one ``error:`` line and a ``hint:`` line. Light to start: no typer
or rich; the library is imported only by the command that needs it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ocistage.bundler.cli.failure import Failure, Voice, failure, write_failure

USAGE = ("usage: ocistage-pyxis-importer get docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]\n"
         "       ocistage-pyxis-importer release\n")


#: how the importer says what :mod:`ocistage.bundler.cli.failure` renders: the options the
#: library's hints tell ``ocistage`` users to pass, said the importer's way (pyxis gives it no
#: options, only the job's environment and the config files)
VOICE = Voice(
    interrupted="the partial downloads are kept; the next get resumes them",
    os_error=None,
    internal="this is a bug in ocistage; please report it",
    instead=(("pass --insecure-registry HOST:PORT",
              "add HOST:PORT to $OCISTAGE_INSECURE_REGISTRIES or set insecure = true under "
              "[registries.\"HOST:PORT\"] in the config file"),
             ("configure a mirror (--mirror)", "configure a mirror in the config file")))


def _get(uri: str) -> int:
    from ocistage.bundler.pyxis.get import get
    from ocistage.bundler.pyxis.jobstep import JobStep
    from ocistage.bundler.settings import load_settings

    settings = load_settings()
    _drop_dead_leases(settings.cache, settings.pyxis_store)
    result = get(uri, settings, JobStep.from_environment(os.environ))
    sys.stdout.write(f"{result.path}\n")
    sys.stdout.flush()
    return 0


def _release() -> int:
    from ocistage.bundler.pyxis.jobstep import JobStep
    from ocistage.bundler.settings import load_settings

    settings = load_settings()
    _drop_dead_leases(settings.cache, settings.pyxis_store)
    roots = [settings.cache] + ([settings.pyxis_store] if settings.pyxis_store else [])
    JobStep.from_environment(os.environ).release([root.absolute() for root in roots])
    return 0


def _drop_dead_leases(*roots: Path | None) -> None:
    """Drop what importers of this user killed on this host left in the stores
    (:mod:`~ocistage.bundler.pyxis.leftovers`); never fails a command."""
    from ocistage.bundler.pyxis.leftovers import drop_leftovers

    for root in roots:
        if root is not None:
            drop_leftovers(root.absolute())


def run(argv: Sequence[str]) -> int:
    """Run one command; every error becomes an ``error:`` and a ``hint:`` line (exit 1, 2
    for a wrong command line, 130 interrupted: :func:`~ocistage.bundler.cli.failure.failure`)."""
    if list(argv) in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    if len(argv) == 2 and argv[0] == "get":
        command = argv[1]
    elif list(argv) == ["release"]:
        command = None
    else:
        write_failure(Failure(f"unknown command line: {' '.join(argv) or '(none)'}",
                              USAGE.strip(), 2))
        return 2
    try:
        return _get(command) if command is not None else _release()
    except (Exception, KeyboardInterrupt) as error:  # pyxis shows stderr, never a traceback
        said = failure(error, VOICE)
        write_failure(said)
        return said.code


def main() -> None:
    import signal

    from ocistage.bundler.cli.exitstatus import end_process
    from ocistage.bundler.cli.memory import limit_malloc_arenas

    limit_malloc_arenas()  # before any thread allocates

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    # a cancelled step (SIGTERM) or a closed terminal or session (SIGHUP), whose default
    # action would end this process at once and leave mksquashfs running, the build lock
    # and the scratch directory behind: stop mksquashfs and clean up, then exit 130
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupt)
    end_process(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
