"""``ocistage submit``: stage a bundle where the job runs and hand it to Slurm.

The caller (the CLI) pulls and bundles; this module stages the bundle, submits
``sbatch --container=STAGED`` (or runs ``srun --container=STAGED``) and ties the staged bundle to
the job with a ``slurm-job`` lease.

Order matters: the job is submitted held (its container path is known in advance, ``TO/NAME``),
the bundle is staged under the job's own lease (the staged marker names it, which is what gc
checks before removing), a cleanup job is submitted, then the job is released. If anything
fails before the release, the job is cancelled and the staged bundle released. ``TO`` and
every directory above it are checked before sbatch is given ``TO/NAME``, and the staged bundle
again before the job is released (docs/trust.md: nobody but the caller and root may be able to
swap what Slurm runs).

The cleanup job (``sbatch --dependency=afterany:JOB``, one task, five minutes) runs once the job
has ended in any way (completed, failed, cancelled with ``scancel``, timed out), whoever is
still logged in: it releases the job's lease and removes the staged bundle unless another live
job holds it (``ocistage unstage`` as that job). So removal follows the job's end by itself, as
fast as Slurm starts a one-task job; nothing has to run ``ocistage cache gc`` (which still
collects what a lost cleanup job left).

The job runs with the image's environment (``PATH``, ``HOME`` and every ``process.env`` entry
of the bundle's config.json): srun/sbatch are started with those values over the caller's, so
the job environment they export (``--export=ALL``, the default) already holds them. That is
the one way that works on every release: slurmstepd 22.05 writes the job environment over
config.json's ``process.env``, 24.05 and 26.05 merge config.json's over the job's (docs/slurm.md).
The cleanup job keeps the caller's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache.ancestors import check_path_trusted
from ocistage.cache.leases import Holder
from ocistage.errors import OcistageError, UsageError
from ocistage.runtimes.bundle_command import resolve_command
from ocistage.runtimes.errors import SlurmError
from ocistage.runtimes.slurm import cancel_job, release_job, sbatch, srun_argv


@dataclass(frozen=True)
class SubmitOptions:
    stage_to: Path                          # staging directory on a filesystem the nodes see
    options: Sequence[str] = ()             # sbatch/srun options, passed through
    command: Sequence[str] = ()             # empty: the bundle's own process.args
    srun: bool = False                      # run blocking with srun instead of sbatch
    copy: bool = False                      # independent writable copy (default: shared, ro)
    name: str | None = None                 # staged name [default: the bundle's name]
    # argv prefix that runs ocistage in the cleanup job (on a compute node)
    ocistage: Sequence[str] = ("ocistage",)
    image_env: bool = True                  # False: the caller's environment wins (host_env)


@dataclass(frozen=True)
class SubmitResult:
    job_id: str | None                      # None for --srun (srun made its own job)
    staged: Path
    lease_id: str | None
    exit_code: int | None = None            # srun's exit status; None: a batch job, not run yet
    cleanup_job_id: str | None = None       # the afterany job that unstages after the job


def bundle_args(bundle: Path) -> list[str]:
    """The bundle's ``process.args`` (what runs when no COMMAND is given)."""
    try:
        config = json.loads((bundle / "config.json").read_text())
        args = config["process"]["args"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{bundle} has no readable config.json with process.args") from exc
    if not isinstance(args, list) or not args or not all(isinstance(a, str) for a in args):
        raise UsageError(f"{bundle}/config.json: process.args is not a list of strings")
    return args


def bundle_env(bundle: Path) -> dict[str, str]:
    """The bundle's ``process.env`` as a mapping (``NAME=value`` entries; others skipped)."""
    try:
        config = json.loads((bundle / "config.json").read_text())
        entries = config["process"].get("env", [])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{bundle} has no readable config.json with a process") from exc
    if not isinstance(entries, list):
        raise UsageError(f"{bundle}/config.json: process.env is not a list")
    env = {}
    for entry in entries:
        name, sep, value = entry.partition("=") if isinstance(entry, str) else ("", "", "")
        if sep and name and "\0" not in entry and encodable(entry):
            env[name] = value
    return env


def job_environ(bundle: Path, image_env: bool,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment srun/sbatch run with: ``base`` (this process's) with the image's
    values over it unless ``image_env`` is false (module docstring)."""
    environ = dict(os.environ if base is None else base)
    if image_env:
        environ.update((name, value) for name, value in bundle_env(bundle).items()
                       if not host_controlling(name))
    return environ


#: variables srun/sbatch read as options: an image's would change how the job is submitted
_CLIENT_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
#: variables that take control of the host process that reads them, not of the job: glibc's
#: own list of what it strips from the environment of a setuid program (UNSECURE_ENVVARS in
#: sysdeps/generic/unsecvars.h: the loader's LD_*, gconv and locale modules, resolver files,
#: malloc tracing, tunables), with every LD_ name. An image's LD_PRELOAD=/tmp/x.so would
#: otherwise load a library a co-tenant planted into the caller's srun (issue 39's hostile pass)
_HOST_LOADER = frozenset({
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
    "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TMPDIR",
    "TZDIR"})


def host_controlling(name: str) -> bool:
    """Whether an image's ``name`` stays out of the environment of sbatch/srun on this host:
    Slurm's client options (``SLURM_*``...) and what glibc lets control a process
    (:data:`_HOST_LOADER`, ``LD_*``). The job gets the image's value from config.json
    (24.05 and later merge it over the job's; docs/slurm.md)."""
    return name.startswith((*_CLIENT_PREFIXES, "LD_")) or name in _HOST_LOADER


def host_overrides(bundle: Path, base: dict[str, str] | None = None) -> list[str]:
    """``NAME=value`` of the caller's environment for each name the bundle's ``process.env``
    sets: a bundle made with these as ``--env`` runs with the host's values on every release
    (24.05 and 26.05 merge config.json's over the job's)."""
    environ = os.environ if base is None else base
    return [f"{name}={environ[name]}" for name in bundle_env(bundle) if name in environ]


def encodable(text: str) -> bool:
    """Whether ``text`` stands for bytes (an argv word or an environment entry can hold it)."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def wrap_command(command: Sequence[str]) -> str:
    """One shell command line that runs ``command`` verbatim (for ``sbatch --wrap``): each
    word quoted (``shlex.quote``), and ``exec`` first, so that the script's first line is a
    command and sbatch reads no ``#SBATCH`` line out of a word (sbatch/opt.c stops at the
    first command)."""
    return "exec " + shlex.join(check_command(command))


def check_command(command: Sequence[str]) -> list[str]:
    """``command`` if every word can be an argv word and the first is no option: else a
    :class:`UsageError` (a NUL, a lone surrogate, a leading ``-``)."""
    hint = "check the image's Entrypoint/Cmd, or the words after --"
    words = list(command)
    for word in words:
        if "\0" in word or not encodable(word):
            raise UsageError(f"the command word {word[:200]!r} holds a NUL or no bytes", hint)
    if words and words[0].startswith("-"):
        raise UsageError(f"the command {words[0][:200]!r} starts with '-' (an option, not a "
                         "program)", hint)
    return words


#: what slurmstepd can put into its RunTime* commands as ``%b``: it writes the bundle path
#: unquoted into a ``/bin/sh -c`` line (container.c ``_generate_pattern``)
_BUNDLE_PATH = re.compile(r"[\w./+,:@=%-]+")


def check_container_path(path: Path) -> Path:
    """``path`` if slurmstepd's shell gets it as one word (letters, digits, ``_./+,:@=%-``),
    else a :class:`UsageError`."""
    if not _BUNDLE_PATH.fullmatch(str(path)):
        raise UsageError(f"slurmstepd cannot run a bundle at {str(path)[:200]!r}: it puts the "
                         "path unquoted into a shell command (oci.conf %b)",
                         "stage to a directory whose path has no spaces, quotes or shell "
                         "syntax (--stage-to)")
    return path


def check_options(options: Sequence[str]) -> None:
    """Refuse the user's options that would set what ``submit`` sets: ``--container...`` and
    ``--wrap``, also abbreviated (getopt_long takes ``--wra=X`` for ``--wrap=X``)."""
    for option in options:
        name = option.partition("=")[0]
        if name.startswith("--container") or (name.startswith("--") and len(name) > 2 and (
                "--wrap".startswith(name) or "--container".startswith(name))):
            raise UsageError(f"{option[:200]} is set by ocistage submit",
                             "pass the command after --, the image as REF")


def submit(bundle: Path, options: SubmitOptions, *, cache_root: Path) -> SubmitResult:
    """Stage ``bundle`` to ``options.stage_to`` and submit it (see the module docstring)."""
    from ocistage.stagers.directory import stage_directory  # a sibling package's API

    check_options(options.options)
    # absolute inside the image: Slurm 24.05 resolves a bare name on the host's PATH
    command = check_command(resolve_command(bundle,
                                            list(options.command) or bundle_args(bundle)))
    name = options.name or (bundle.name + ("-" + _unique() if options.copy else ""))
    path = check_container_path(options.stage_to.absolute() / name)  # before anything is staged
    link = False if options.copy else None
    if options.srun:
        # srun makes its job as it starts: the staged bundle is held by this process until
        # srun returns, then removed (kept only for another live lease: the same bundle staged
        # by another submit meanwhile), as the afterany job removes a batch job's
        holder = Holder.this_process()
        staged = stage_directory(bundle, options.stage_to, cache_root=cache_root, name=name,
                                 holder=holder, link=link)
        try:
            check_handed_over(Path(staged.path))
            argv = srun_argv(options.options, container=Path(staged.path), command=command)
            try:
                exit_code = subprocess.run(argv, check=False,
                                           env=job_environ(bundle, options.image_env)).returncode
            except OSError as exc:
                raise SlurmError(f"cannot run srun: {exc.strerror}") from exc
        finally:
            _unstage_as(Path(staged.path), holder, cache_root)
        return SubmitResult(None, Path(staged.path), staged.lease_id, exit_code)
    # submit held, stage under the job's own lease, submit the cleanup job, then release: the
    # staged bundle's marker names the job's lease, the cleanup job releases it
    check_path_trusted(options.stage_to, "stage target", make=0o755, shared=True)
    user_holds = any(o == "--hold" or o == "-H" for o in options.options)
    job_id = sbatch(held_job_options(options.options), container=path,
                    wrap=wrap_command(command),
                    env=job_environ(bundle, options.image_env))
    staged_path: Path | None = None
    try:
        staged = stage_directory(bundle, options.stage_to, cache_root=cache_root, name=name,
                                 holder=Holder.slurm_job(job_id), link=link)
        staged_path = Path(staged.path)
        check_handed_over(staged_path)
        cleanup_id = sbatch(cleanup_options(options.options, job_id), container=None,
                            wrap=wrap_command(unstage_command(options.ocistage, staged_path,
                                                              job_id, cache_root)))
        if not user_holds:
            release_job(job_id)
    except BaseException:
        with contextlib.suppress(SlurmError):
            cancel_job(job_id)
        if staged_path is not None:
            _unstage(staged_path, job_id, cache_root)
        raise
    return SubmitResult(job_id, staged_path, staged.lease_id, cleanup_job_id=cleanup_id)


def held_job_options(options: Sequence[str]) -> list[str]:
    """The job's sbatch options: ``--hold`` first (a trailing ``-p`` of the user's must not
    take it as its value and leave the job unheld), then the user's."""
    return ["--hold", *options]


def check_handed_over(staged: Path) -> None:
    """The staged bundle Slurm runs, and every directory above it, can be changed by nobody
    but the caller and root (:func:`ocistage.cache.ancestors.check_path_trusted`)."""
    check_path_trusted(staged, "staged bundle", follow=False)


#: sbatch options that say who pays and where a job may run: the cleanup job needs the same
_PLACEMENT = {"-p": "--partition", "-A": "--account", "-q": "--qos", "-M": "--clusters",
              "--partition": "--partition", "--account": "--account", "--qos": "--qos",
              "--clusters": "--clusters", "--reservation": "--reservation"}


def cleanup_options(options: Sequence[str], job_id: str,
                    name: str = "ocistage-unstage") -> list[str]:
    """sbatch options of the cleanup job of ``job_id`` (named ``NAME-JOB``): after it,
    whatever its end."""
    result = [f"--dependency=afterany:{job_id}", f"--job-name={name}-{job_id}",
              "--nodes=1", "--ntasks=1", "--time=5", "--output=/dev/null",
              "--kill-on-invalid-dep=no"]
    args = list(options)
    for index, option in enumerate(args):
        name, sep, value = option.partition("=")
        if name in _PLACEMENT:
            if sep:
                result.append(f"{_PLACEMENT[name]}={value}")
            elif index + 1 < len(args):
                result.append(f"{_PLACEMENT[name]}={args[index + 1]}")
        elif len(name) > 2 and name[:2] in _PLACEMENT and not name.startswith("--"):
            result.append(f"{_PLACEMENT[name[:2]]}={name[2:]}")  # -pdebug
    return result


def this_ocistage() -> tuple[str, ...]:
    """The argv prefix that runs this ocistage (this interpreter) on a node sharing its
    filesystem. ``-P``: the job's working directory is not put on ``sys.path`` (a ``cache/``
    directory there would shadow the package)."""
    return (sys.executable, "-P", "-m", "ocistage")


def unstage_command(ocistage: Sequence[str], staged: Path, job_id: str,
                    cache_root: Path) -> list[str]:
    """What the cleanup job runs: ``ocistage unstage`` as the job (SLURM_JOB_ID is what
    unstage reads), which releases that job's lease and removes the bundle if no other live
    lease holds it; nothing there (a ``cache gc`` came first) is no failure."""
    return ["env", f"SLURM_JOB_ID={job_id}", *ocistage, "unstage", "--cache",
            str(cache_root), "--quiet", "--missing-ok", str(staged)]


def _unstage(staged: Path, job_id: str, cache_root: Path) -> None:
    _unstage_as(staged, Holder.slurm_job(job_id), cache_root)


def _unstage_as(staged: Path, holder: Holder, cache_root: Path) -> None:
    """Drop ``holder``'s lease of ``staged`` and remove it unless another live lease holds
    it; best effort: the error in flight (or the job's own status) wins, and what is left is
    gc's."""
    from ocistage.stagers.unstage import unstage  # a sibling package's API

    with contextlib.suppress(OcistageError, OSError):
        unstage(staged, cache_root=cache_root, holder=holder)


def _unique() -> str:
    import uuid

    return uuid.uuid4().hex[:12]
