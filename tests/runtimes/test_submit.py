"""ocistage.runtimes.submit: the cleanup job that removes a submitted job's staged bundle after it
(the
run on a real cluster is tests/e2e/test_submit_cleanup.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ocistage.runtimes.submit import cleanup_options, this_ocistage, unstage_command


def test_cleanup_job_runs_after_the_job_whatever_its_end_where_the_job_may_run() -> None:
    options = cleanup_options(["-N3", "-p", "gpu", "--account=proj", "-qlow", "--time=60",
                               "--reservation", "maint", "--output=x.out"], "42")
    assert options[:2] == ["--dependency=afterany:42", "--job-name=ocistage-unstage-42"]
    assert "--kill-on-invalid-dep=no" in options and "--ntasks=1" in options
    assert options[-4:] == ["--partition=gpu", "--account=proj", "--qos=low",
                            "--reservation=maint"]
    assert not [o for o in options if o.startswith(("-N3", "--time=60", "--output=x"))]


def test_cleanup_unstages_as_the_job_through_this_ocistage() -> None:
    argv = unstage_command(("/venv/bin/python", "-m", "ocistage"), Path("/s/b1"), "42",
                           Path("/c"))
    assert argv == ["env", "SLURM_JOB_ID=42", "/venv/bin/python", "-m", "ocistage",
                    "unstage", "--cache", "/c", "--quiet", "--missing-ok", "/s/b1"]


def test_the_cleanup_jobs_ocistage_runs_from_a_directory_holding_a_cache(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()  # `python -m` from here imported this instead of the package
    (tmp_path / "cache" / "leases").mkdir()
    result = subprocess.run([*this_ocistage(), "unstage", "--cache", str(tmp_path / "c"),
                             str(tmp_path / "absent")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, check=False)
    # ImportError from ./cache without -P; ocistage itself says that nothing is staged there
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: nothing is staged at {tmp_path / 'absent'}")


def test_a_batch_job_has_no_exit_code_yet(tmp_path: Path) -> None:
    """``submit --json`` of a batch job: the job has not run when sbatch returns, so its exit
    code is null, not 0 (issue 38); with --srun it is the step's."""
    from ocistage.bundler.flows.submit import Submitted
    from ocistage.runtimes.submit import SubmitResult

    batch = Submitted(tmp_path, SubmitResult("42", tmp_path / "b", None)).to_json()
    assert batch["job_id"] == "42" and batch["exit_code"] is None
    step = Submitted(tmp_path, SubmitResult(None, tmp_path / "b", None, 3)).to_json()
    assert step["exit_code"] == 3


def _bundle_with_env(tmp_path: Path, env: list[str]) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"process": {"env": env}}))
    return bundle


def test_the_images_loader_variables_never_reach_srun_or_sbatch(tmp_path: Path) -> None:
    """srun and sbatch run on the caller's host with the image's environment over the caller's
    (so that 22.05's job sees it): an image's LD_PRELOAD, LD_LIBRARY_PATH, GCONV_PATH... would
    take control of them (a library a co-tenant planted in /tmp loaded into the caller's
    srun). They are left out, as Slurm's own client options are; the rest is the image's."""
    from ocistage.runtimes.submit import job_environ

    planted = tmp_path / "planted.so"
    bundle = _bundle_with_env(tmp_path, [
        f"LD_PRELOAD={planted}", f"LD_LIBRARY_PATH={tmp_path}", f"LD_AUDIT={planted}",
        f"GCONV_PATH={tmp_path}", "GLIBC_TUNABLES=glibc.malloc.check=3", "SLURM_PARTITION=x",
        "SBATCH_PARTITION=x", "PATH=/opt/app/bin:/usr/bin", "APP=1"])
    base = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "LD_LIBRARY_PATH": "/site/lib"}
    environ = job_environ(bundle, True, base)
    assert environ == {"PATH": "/opt/app/bin:/usr/bin", "HOME": "/home/u", "APP": "1",
                       "LD_LIBRARY_PATH": "/site/lib"}  # the caller's own stays
    # what the dynamic loader of a real host program makes of that environment: nothing
    run = subprocess.run(["/bin/true"], env=job_environ(bundle, True, {"PATH": "/usr/bin"}),
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0 and run.stderr == ""
    # and what it made of the image's values before (the loader tried the planted library)
    raw = subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(planted)}, capture_output=True,
                         text=True, timeout=60, check=False)
    assert "cannot be preloaded" in raw.stderr
