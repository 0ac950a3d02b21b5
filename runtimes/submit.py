"""``ocistage submit``: stage a bundle where the job runs and hand it to Slurm.

The caller (the CLI) pulls and bundles; this module stages the bundle, submits
``sbatch --container=STAGED`` (or runs ``srun --container=STAGED``) and ties the staged bundle to
the job with a ``slurm-job`` lease, so ``ocistage cache gc`` removes it once the job has ended.

Order matters: the job is submitted held (its container path is known in advance, ``TO/NAME``),
the bundle is staged under the job's own lease (the staged marker names it, which is what gc
checks before removing), then the job is released. If staging fails the job is cancelled.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bundler.bundle_command import resolve_command
from cache import leases
from cache.errors import SlurmError, UsageError
from cache.leases import Holder
from runtimes.slurm import cancel_job, release_job, sbatch, srun_argv


@dataclass(frozen=True)
class SubmitOptions:
    stage_to: Path                          # staging directory on a filesystem the nodes see
    options: Sequence[str] = ()             # sbatch/srun options, passed through
    command: Sequence[str] = ()             # empty: the bundle's own process.args
    srun: bool = False                      # run blocking with srun instead of sbatch
    copy: bool = False                      # independent writable copy (default: shared, ro)
    name: str | None = None                 # staged name [default: the bundle's name]


@dataclass(frozen=True)
class SubmitResult:
    job_id: str | None                      # None for --srun (srun made its own job)
    staged: Path
    lease_id: str | None
    exit_code: int = 0                      # srun's exit status


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


def wrap_command(command: Sequence[str]) -> str:
    """One shell command line that runs ``command`` verbatim (for ``sbatch --wrap``)."""
    return "exec " + shlex.join(command)


def check_options(options: Sequence[str]) -> None:
    for option in options:
        if option.startswith("--container") or option in ("--wrap",) or \
                option.startswith("--wrap="):
            raise UsageError(f"{option} is set by ocistage submit",
                             "pass the command after --, the image as REF")


def submit(bundle: Path, options: SubmitOptions, *, cache_root: Path) -> SubmitResult:
    """Stage ``bundle`` to ``options.stage_to`` and submit it (see the module docstring)."""
    from stagers.stage import stage_directory  # a sibling package's API

    check_options(options.options)
    # absolute inside the image: Slurm 24.05 resolves a bare name on the host's PATH
    command = resolve_command(bundle, list(options.command) or bundle_args(bundle))
    name = options.name or (bundle.name + ("-" + _unique() if options.copy else ""))
    link = False if options.copy else None
    if options.srun:
        # srun makes its job as it starts: the staged bundle is held by this process until
        # srun returns, then gc may collect it
        staged = stage_directory(bundle, options.stage_to, cache_root=cache_root, name=name,
                                 holder=Holder.this_process(), link=link)
        argv = srun_argv(options.options, container=Path(staged.path), command=command)
        try:
            exit_code = subprocess.run(argv, check=False).returncode
        except OSError as exc:
            raise SlurmError(f"cannot run srun: {exc.strerror}") from exc
        return SubmitResult(None, Path(staged.path), staged.lease_id, exit_code)
    # submit held, stage under the job's own lease, then release: the staged bundle's marker
    # names the job's lease, so gc removes it once the job has ended
    path = options.stage_to.absolute() / name
    user_holds = any(o == "--hold" or o == "-H" for o in options.options)
    job_id = sbatch([*options.options, "--hold"], container=path, wrap=wrap_command(command))
    try:
        staged = stage_directory(bundle, options.stage_to, cache_root=cache_root, name=name,
                                 holder=Holder.slurm_job(job_id), link=link)
        if not user_holds:
            release_job(job_id)
    except BaseException:
        with contextlib.suppress(SlurmError):
            cancel_job(job_id)
        raise
    return SubmitResult(job_id, Path(staged.path), staged.lease_id)


def _drop(cache_root: Path, lease_id: str | None) -> None:
    if lease_id:
        with contextlib.suppress(UsageError):
            leases.release(cache_root, lease_id)


def _unique() -> str:
    import uuid

    return uuid.uuid4().hex[:12]
