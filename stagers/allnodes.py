"""Staging onto every node of a Slurm allocation, with Slurm itself.

Inside a job, ``ocistage stage --all-nodes ...`` runs the same ``ocistage stage`` once per node
of the allocation: ``srun --nodes=N --ntasks=N --ntasks-per-node=1 --overlap
--kill-on-bad-exit=1 ocistage stage ... --json-lines``. Each task stages node-locally (its own
lock, lease and marker under the node's target) and prints one JSON line labelled with its
Slurm node name (``SLURMD_NODENAME``: several nodes may share a host name); the results are
collected per node. The source must be readable on every node (a bundle in a shared cache, or a
URL); a REF is turned into a bundle once, on the calling node, before the step starts, so the
whole job makes one manifest request and fetches each blob once.

It runs from the job's own shell (``salloc``, the ``sbatch`` script) or from a one-task step.
Inside a step of several tasks (``srun -N3 ocistage stage --all-nodes``) every task would start
its own srun over all nodes and resolve the REF again: N x N stagers and N manifest requests,
so that is refused with a hint.

Each stager is told ``--node-local``: its lease records its node
(:class:`ocistage.cache.leases.StagedPlace`), so the copies one path names on the nodes do not
hold each other. Removing them when the job ends is the caller's
(:mod:`ocistage.bundler.flows.nodecleanup`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ocistage.cache.nodes import this_node
from ocistage.errors import UsageError
from ocistage.stagers.errors import StageError


@dataclass(frozen=True)
class NodeResult:
    node: str
    result: dict[str, Any]


def allocation_nodes(environ: Mapping[str, str] | None = None) -> int:
    """How many nodes the current allocation has; UsageError outside a job."""
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID"):
        raise UsageError("--all-nodes works inside a Slurm job (salloc, sbatch or srun)",
                         "run it from a job script, or stage to one node without --all-nodes")
    count = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    if not count.isdigit() or int(count) < 1:
        raise UsageError(f"unexpected SLURM_JOB_NUM_NODES={count!r}")
    return int(count)


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """This node's Slurm name inside a job step (``SLURMD_NODENAME``), else the host name."""
    return this_node(environ)


def check_not_in_a_multitask_step(environ: Mapping[str, str] | None = None) -> None:
    """UsageError inside a job step of more than one task (see the module docstring)."""
    env = os.environ if environ is None else environ
    if not env.get("SLURM_STEP_ID"):
        return  # the job's shell: salloc or the batch script
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    if tasks.isdigit() and int(tasks) > 1:
        raise UsageError(
            f"--all-nodes inside a job step of {tasks} tasks (srun) would stage every node "
            f"{tasks} times over",
            "run `ocistage stage --all-nodes` once from the job script or the salloc shell "
            "(not under srun), or drop --all-nodes to stage only this task's node")


def check_all_nodes(environ: Mapping[str, str] | None = None) -> int:
    """Whether --all-nodes may run here (inside a job, not in a step of several tasks); the
    allocation's node count. Callers check before they resolve the source."""
    nodes = allocation_nodes(environ)
    check_not_in_a_multitask_step(environ)
    return nodes


def srun_argv(inner: Sequence[str], nodes: int, srun: str = "srun") -> list[str]:
    """The srun command running ``inner`` (an ``ocistage stage`` argv) once per node."""
    return [srun, f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--overlap",
            "--kill-on-bad-exit=1", "--quiet", *inner]


def parse_lines(output: str) -> list[NodeResult]:
    results = []
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            results.append(NodeResult(str(doc.get("node", "?")), doc))
    return results


def stage_all_nodes(inner: Sequence[str], environ: Mapping[str, str] | None = None,
                    timeout: float | None = None) -> list[NodeResult]:
    """Run ``inner`` on every node of the allocation; one result per node, or StageError."""
    nodes = check_all_nodes(environ)
    srun = shutil.which("srun")
    if srun is None:
        raise StageError("srun is not on PATH", "--all-nodes needs Slurm's client commands")
    argv = srun_argv(inner, nodes, srun)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False,
                              env=dict(environ) if environ is not None else None)
    except (OSError, subprocess.SubprocessError) as exc:
        raise StageError(f"srun failed: {exc}") from exc
    results = sorted(parse_lines(proc.stdout), key=lambda r: r.node)
    if proc.returncode != 0 or len({r.node for r in results}) != nodes:
        lines = proc.stderr.strip().splitlines()
        # a stager's own error (and its hint) says more than srun's "task 1: Terminated"
        own = [line for line in lines if line.startswith("error: ")]
        detail = own[:1] or lines
        raise StageError(
            f"staging on all {nodes} nodes failed (srun exit {proc.returncode}, "
            f"{len(results)} nodes reported): {detail[-1] if detail else 'no error output'}",
            "run `ocistage stage` without --all-nodes on one node to see the error")
    return results
