"""The one-node Slurm of the end-to-end tests: find it, start it, run jobs on it.

:func:`ensure_slurm` uses a Slurm whose controller ``sinfo`` reaches; when none answers and we
are root, it runs ``.ci/slurm.sh`` (which installs nothing that is present already, writes the
configuration with ``ocistage runtime oci-conf`` and starts munged, slurmctld and slurmd). If
Slurm still cannot be reached the test is skipped, or fails under ``OCISTAGE_REQUIRE_E2E=1``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from runtimes.slurm import controller_reachable, parse_scontrol_record
from tests.e2e.components import e2e_required, require_binary

REPO = Path(__file__).resolve().parents[2]
SLURM_SH = REPO / ".ci" / "slurm.sh"
TEST_USER = "ocistage-slurm"
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def _unavailable(reason: str) -> None:
    if e2e_required():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def ensure_slurm() -> None:
    for binary in ("sinfo", "srun", "sbatch", "scontrol", "runc"):
        require_binary(binary)
    if controller_reachable():
        return
    if os.getuid() == 0 and shutil.which("slurmctld") and SLURM_SH.is_file():
        result = subprocess.run(["bash", str(SLURM_SH)], capture_output=True, text=True,
                                timeout=600, stdin=subprocess.DEVNULL, check=False)
        if result.returncode != 0:
            _unavailable(f".ci/slurm.sh failed:\n{result.stdout[-3000:]}\n"
                         f"{result.stderr[-3000:]}")
        if controller_reachable():
            return
    _unavailable("no Slurm controller answers `sinfo` (run .ci/slurm.sh as root to start a "
                 "one-node Slurm)")


def job_record(job_id: str) -> dict[str, str]:
    result = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                            text=True, timeout=30, check=False)
    if result.returncode != 0:
        return {}
    return parse_scontrol_record(result.stdout)


def wait_for_job(job_id: str, timeout: float = 120) -> dict[str, str]:
    """Wait until the job has finished; returns its last ``scontrol show job`` record."""
    deadline = time.monotonic() + timeout
    record: dict[str, str] = {}
    while time.monotonic() < deadline:
        current = job_record(job_id)
        if current:
            record = current
        state = record.get("JobState", "")
        if state in FINISHED:
            return record
        if not current and record:
            return record  # purged (MinJobAge) after we saw it
        time.sleep(0.3)
    pytest.fail(f"job {job_id} did not finish within {timeout}s: {record}", pytrace=False)


def wait_until_gone_from_squeue(job_id: str, timeout: float = 60) -> None:
    """Wait until squeue no longer lists the job as active (what lease liveness checks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"],
                                capture_output=True, text=True, timeout=30, check=False)
        if result.returncode != 0 or not result.stdout.strip():
            return
        time.sleep(0.3)
    pytest.fail(f"job {job_id} still in squeue after {timeout}s", pytrace=False)


def read_output(path: Path, timeout: float = 20) -> str:
    """A job's output file (it may appear a moment after the job is reported finished)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        time.sleep(0.2)
    pytest.fail(f"job output {path} never appeared", pytrace=False)


@dataclass(frozen=True)
class JobUser:
    """An unprivileged account for running jobs as someone other than root."""

    name: str
    uid: int
    gid: int
    home: Path

    def argv(self, *command: str) -> list[str]:
        return ["runuser", "-u", self.name, "--", *command]


def ensure_test_user() -> JobUser:
    """Create (once) an unprivileged user with a home and a /run/user/UID (as logind would)."""
    if os.getuid() != 0:
        pytest.skip("creating an unprivileged test user needs root")
    require_binary("useradd")
    require_binary("runuser")
    try:
        entry = pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", TEST_USER],
                       check=True, capture_output=True, timeout=60)
        entry = pwd.getpwnam(TEST_USER)
    run_dir = Path("/run/user") / str(entry.pw_uid)
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chown(run_dir, entry.pw_uid, entry.pw_gid)
    run_dir.chmod(0o700)
    return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
