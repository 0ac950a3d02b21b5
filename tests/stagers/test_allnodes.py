"""--all-nodes: the srun command and the parsing of per-node results (the real run is in
tests/e2e/test_stage_slurm.py)."""

from __future__ import annotations

import json
import socket

import pytest

from ocistage.errors import UsageError
from ocistage.stagers.allnodes import (
    allocation_nodes,
    check_all_nodes,
    node_name,
    parse_lines,
    srun_argv,
    stage_all_nodes,
)


def test_allocation_nodes_needs_a_job() -> None:
    with pytest.raises(UsageError, match="inside a Slurm job"):
        allocation_nodes({})
    assert allocation_nodes({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "3"}) == 3
    assert allocation_nodes({"SLURM_JOB_ID": "7", "SLURM_NNODES": "2"}) == 2
    with pytest.raises(UsageError):
        allocation_nodes({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "x"})


def test_srun_runs_one_task_per_node() -> None:
    argv = srun_argv(["ocistage", "stage", "/b", "--to", "/tmp/x"], 4, "/usr/bin/srun")
    assert argv[0] == "/usr/bin/srun"
    assert "--ntasks-per-node=1" in argv and "--nodes=4" in argv and "--ntasks=4" in argv
    assert argv[-5:] == ["ocistage", "stage", "/b", "--to", "/tmp/x"]


def test_results_are_read_from_json_lines_among_other_output() -> None:
    out = "\n".join(["srun: warning: something",
                     json.dumps({"node": "n1", "path": "/tmp/x/b"}),
                     "{broken",
                     json.dumps({"node": "n2", "path": "/tmp/x/b"})])
    results = parse_lines(out)
    assert [r.node for r in results] == ["n1", "n2"]
    assert results[1].result["path"] == "/tmp/x/b"


JOB = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "3"}


def test_the_job_shell_and_a_one_task_step_may_stage_all_nodes() -> None:
    assert check_all_nodes(JOB) == 3  # salloc shell, batch script: no step id
    assert check_all_nodes({**JOB, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"}) == 3


def test_a_step_of_several_tasks_is_refused_before_anything_runs() -> None:
    step = {**JOB, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "3", "PATH": "/nonexistent"}
    with pytest.raises(UsageError, match="step of 3 tasks") as caught:
        check_all_nodes(step)
    assert "not under srun" in (caught.value.hint or "")
    with pytest.raises(UsageError, match="step of 3 tasks"):
        stage_all_nodes(["ocistage", "stage", "/b", "--to", "/t"], step)


def test_results_are_labelled_with_the_slurm_node_name() -> None:
    assert node_name({"SLURMD_NODENAME": "n2"}) == "n2"
    assert node_name({}) == socket.gethostname()
