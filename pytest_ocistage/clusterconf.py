"""Writes the configuration of a private test cluster: its ``slurm.conf``, and the ``oci.conf``
that ``ocistage runtime oci-conf`` makes for it (checked by ``--check``)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_ocistage.clusterspec import ClusterError, ClusterSpec
from pytest_ocistage.components import free_port


def slurm_conf(spec: ClusterSpec, base: Path, host: str, nodes: Sequence[str],
                ports: Mapping[str, int]) -> str:
    mem = max(1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 // 4)
    cpus = os.cpu_count() or 1
    lines = [
        f"# private test cluster {spec.name} (pytest_ocistage/clusterconf.py)",
        f"ClusterName={spec.name}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={base / 'munge-socket' / 'munge.socket'}",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "ReturnToService=2",
        f"PlugStackConfig={base / 'etc' / 'plugstack.conf'}",
        f"StateSaveLocation={base / 'state'}",
        f"SlurmdSpoolDir={base / 'spool' / '%n'}",
        f"SlurmctldPidFile={base / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={base / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={base / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={base / 'log' / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=30",
        "Waittime=0",
    ]
    for node in nodes:
        lines.append(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 "
                     f"Port={ports[node]} CPUs={cpus} RealMemory={mem} State=UNKNOWN")
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def oci_conf(spec: ClusterSpec, base: Path, version: str, ocistage: Sequence[str],
              env: Mapping[str, str]) -> str:
    """``ocistage runtime oci-conf`` for this cluster, checked by ``--check``."""
    major_minor = ".".join(version.split(".")[:2])
    result = subprocess.run(
        [*ocistage, "runtime", "oci-conf", "--runtime", spec.oci_runtime, "--slurm-version",
         major_minor],
        capture_output=True, text=True, timeout=60, env=dict(env), check=False,
        stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise ClusterError(f"ocistage runtime oci-conf failed: {result.stderr}")
    text = result.stdout
    if (tuple(int(part) for part in major_minor.split(".")) >= (23, 2)
            and not re.search(r"(?im)^\s*SrunPath\s*=", text)):
        text += f"SrunPath={spec.bin_dir / 'srun'}\n"
    draft = base / "etc" / "oci.conf.draft"
    draft.write_text(text)
    check = subprocess.run([*ocistage, "runtime", "oci-conf", "--check", str(draft),
                            "--slurm-version", major_minor], capture_output=True, text=True,
                           timeout=60, env=dict(env), check=False, stdin=subprocess.DEVNULL)
    draft.unlink()
    if check.returncode != 0:
        raise ClusterError(f"ocistage runtime oci-conf --check rejects its own oci.conf:\n"
                           f"{check.stdout}{check.stderr}")
    return text
