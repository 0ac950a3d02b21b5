"""Thin wrappers around Slurm's commands: version, ``sbatch``, ``srun``, ``scontrol``, ``scancel``.

Every call goes through :func:`_run`, the one place where a missing binary or a failed command
becomes a :class:`SlurmError`. Nothing here decides policy (what to stage, which runtime):
it only builds argument lists and parses what Slurm prints.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ocistage.errors import UsageError
from ocistage.runtimes.errors import SlurmError


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> SlurmVersion:
        """``22.05``, ``22.05.8``, ``slurm 23.11.4`` or ``slurm-wlm 22.05.8`` -> a version."""
        match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
        if match is None:
            raise UsageError(f"not a Slurm version: {text!r}",
                             "Slurm versions look like 22.05 or 23.11.4")
        return cls(int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}"


def _run(argv: Sequence[str], *, timeout: float = 60,
         env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    binary = shutil.which(argv[0])
    if binary is None:
        raise SlurmError(f"{argv[0]} not found on PATH",
                         "install Slurm's client commands (Debian: slurm-client)")
    try:
        return subprocess.run([binary, *argv[1:]], capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL,
                              env=dict(env) if env is not None else None)
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:.0f}s") from exc
    except OSError as exc:
        raise SlurmError(f"cannot run {argv[0]}: {exc.strerror}") from exc


def _failure(argv: Sequence[str], result: subprocess.CompletedProcess[str]) -> SlurmError:
    detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
    last = detail[-1] if detail else f"exit status {result.returncode}"
    return SlurmError(f"{argv[0]} failed: {last}")


def installed_version() -> SlurmVersion:
    """The version of the installed Slurm commands (``scontrol --version``, asked through the
    bounded :func:`ocistage.runtimes.probe.probe`: whatever is first on PATH is trusted with
    no more than a version line's worth of memory).

    Slurm 22.05's commands refuse to print even their version without a configuration; when
    none is found, ask again with a throw-away minimal ``SLURM_CONF``.
    """
    from ocistage.runtimes.probe import probe

    result = probe(["scontrol", "--version"], timeout=60)
    if result is None:
        raise SlurmError("scontrol not found on PATH (or it cannot be run)",
                         "install Slurm's client commands (Debian: slurm-client)")
    if result.returncode != 0:
        with tempfile.TemporaryDirectory(prefix="ocistage-slurm-") as scratch:
            conf = Path(scratch) / "slurm.conf"
            conf.write_text("ClusterName=probe\nSlurmctldHost=localhost\n")
            result = probe(["scontrol", "--version"], timeout=60,
                           env={**os.environ, "SLURM_CONF": str(conf)})
    if result is None or result.returncode != 0:
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines() if result else []
        last = detail[-1][:200] if detail else (
            f"exit status {result.returncode}" if result and result.returncode is not None
            else "no answer within 60s")
        raise SlurmError(f"scontrol --version failed: {last}")
    first = result.stdout.strip().splitlines()[:1]
    return SlurmVersion.parse(first[0][:200] if first else "")


def controller_reachable(timeout: float = 15) -> bool:
    """Whether ``sinfo`` answers (a controller is up and we may talk to it)."""
    try:
        result = _run(["sinfo", "-h", "-o", "%T"], timeout=timeout)
    except SlurmError:
        return False
    return result.returncode == 0


def sbatch(options: Sequence[str], *, container: Path | None, wrap: str | None = None,
           script: Path | None = None, env: Mapping[str, str] | None = None,
           program: str = "sbatch") -> str:
    """Submit a batch job; returns its id (``sbatch --parsable``). ``program``: the sbatch
    to run (a name looked up on PATH, or a path)."""
    argv = sbatch_argv(options, container=container, wrap=wrap, script=script,
                       program=program)
    result = _run(argv, env=env)
    if result.returncode != 0:
        raise _failure(argv, result)
    job_id = result.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed {result.stdout.strip()!r} instead of a job id")
    return job_id


def sbatch_argv(options: Sequence[str], *, container: Path | None, wrap: str | None = None,
                script: Path | None = None, program: str = "sbatch") -> list[str]:
    """The ``sbatch`` command line: ocistage's own options first, each one word
    (``--container=PATH``, ``--wrap=TEXT``), then ``options`` (the user's), then ``--`` and
    the script. No value of ours can become an option or be taken as the value of one of the
    user's (a trailing ``-p`` is sbatch's error, not a partition named ``--hold``)."""
    if (wrap is None) == (script is None):
        raise UsageError("sbatch needs exactly one of a --wrap command or a script")
    argv = [program, "--parsable"]
    if container is not None:
        argv.append(f"--container={container}")
    if wrap is not None:
        return [*argv, f"--wrap={wrap}", *options]
    return [*argv, *options, "--", str(script)]


def srun_argv(options: Sequence[str], *, container: Path | None,
              command: Sequence[str]) -> list[str]:
    """The ``srun`` command line (run by the caller so that it inherits the terminal):
    ``--container=PATH`` first (no option of the user's can take it as its value), the user's
    options, then ``--`` and the command (an image's ``--output=...`` is a word of its
    command, never an option of srun's)."""
    srun = shutil.which("srun")
    if srun is None:
        raise SlurmError("srun not found on PATH",
                         "install Slurm's client commands (Debian: slurm-client)")
    argv = [srun]
    if container is not None:
        argv.append(f"--container={container}")
    return [*argv, *options, "--", *command]


def parse_scontrol_record(text: str) -> dict[str, str]:
    """Split one ``scontrol -o`` line of ``Key=Value`` pairs; values may contain spaces.

    A value runs until the next `` Key=`` whose key starts with a capital letter, which is how
    scontrol prints (``Command=/bin/sh -c x`` keeps its spaces).
    """
    line = text.strip().splitlines()[0] if text.strip() else ""
    fields: dict[str, str] = {}
    for match in re.finditer(r"(?:^|\s)([A-Z][A-Za-z0-9_:/]*)=(.*?)(?=\s[A-Z][A-Za-z0-9_:/]*=|$)",
                             line):
        fields.setdefault(match.group(1), match.group(2))
    return fields


def release_job(job_id: str) -> None:
    """``scontrol release``: let a job submitted with ``--hold`` start."""
    argv = ["scontrol", "release", job_id]
    result = _run(argv)
    if result.returncode != 0:
        raise _failure(argv, result)


def cancel_job(job_id: str, *, program: str = "scancel",
               env: Mapping[str, str] | None = None) -> None:
    """``scancel``; errors are reported (the caller decides whether they matter)."""
    argv = [program, job_id]
    result = _run(argv, env=env)
    if result.returncode != 0:
        raise _failure(argv, result)
