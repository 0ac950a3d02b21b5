"""The cleanup job of a scrun-staged bundle: its sbatch options, environment and cancelling
(queueing, running and cancelling it on the real 24.05 cluster: tests/e2e/test_scrun_24_05.py)."""

from __future__ import annotations

from pathlib import Path

from ocistage.runtimes.scrun_cleanup import (
    cancel_cleanup,
    cleanup_job_options,
    stage_out_command,
    submit_env,
)


def test_options_follow_the_job_and_pin_a_node_local_bundle_to_its_node() -> None:
    environ = {"SLURM_JOB_PARTITION": "debug", "SLURM_JOB_ACCOUNT": "physics",
               "SLURM_JOB_QOS": "", "SLURM_NNODES": "3"}
    options = cleanup_job_options("42", node="n2", environ=environ)
    assert options[:2] == ["--dependency=afterany:42", "--job-name=ocistage-scrun-unstage-42"]
    assert "--partition=debug" in options and "--account=physics" in options
    assert not any(o.startswith("--qos") for o in options)  # empty: the default
    assert options[-1] == "--nodelist=n2"
    assert {"--nodes=1", "--ntasks=1", "--kill-on-invalid-dep=no"} <= set(options)
    shared = cleanup_job_options("42", node=None, environ={})
    assert not any(o.startswith("--nodelist") for o in shared)


def test_sbatch_inside_a_step_does_not_inherit_the_steps_shape() -> None:
    env = submit_env({"SLURM_CONF": "/c", "SLURM_NNODES": "3", "SBATCH_PARTITION": "x",
                      "SRUN_CPUS_PER_TASK": "4", "SALLOC_X": "y", "PATH": "/bin", "HOME": "/h"})
    assert env == {"SLURM_CONF": "/c", "PATH": "/bin", "HOME": "/h"}


def test_the_job_runs_stage_out_of_that_bundle_with_that_cache(tmp_path: Path) -> None:
    argv = stage_out_command(tmp_path / "b", tmp_path / "cache", ocistage=["/opt/ocistage"])
    assert argv == ["/opt/ocistage", "scrun", "stage-out", "--bundle", str(tmp_path / "b"),
                    "--cache", str(tmp_path / "cache")]


def test_the_cleanup_job_does_not_cancel_itself() -> None:
    # its own stage-out finds the marker naming it: SLURM_JOB_ID is that job; no scancel runs
    assert cancel_cleanup("77", sbatch_program="/nonexistent/sbatch",
                          environ={"SLURM_JOB_ID": "77"}) is False


def test_cancelling_is_best_effort() -> None:
    assert cancel_cleanup("77", sbatch_program="/nonexistent/sbatch", environ={}) is False
