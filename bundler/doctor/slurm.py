"""The doctor's checks of Slurm: its commands and version, where this node's configuration
is, and the ``oci.conf`` beside it linted for that version."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ocistage.bundler.doctor.probes import command_output
from ocistage.bundler.doctor.report import Check, missing, ok, warn
from ocistage.bundler.doctor.runtimestate import check_runtime_state
from ocistage.errors import OcistageError

if TYPE_CHECKING:
    from ocistage.runtimes.slurm import SlurmVersion

#: ``SLURM_CONF = PATH`` in what ``scontrol show config`` prints: the slurm.conf this node's
#: Slurm reads, wherever it was built to look (a prefix build's own etc/, a configless cache)
_SLURM_CONF_LINE = re.compile(r"^SLURM_CONF\s*=\s*(\S.*?)\s*$", re.MULTILINE)


def check_slurm(version: SlurmVersion | None, error: str | None) -> Check:
    if version is None:
        return missing("slurm", f"no Slurm commands here ({error}): submit, runtime oci-conf "
                                "and the scrun hooks need them",
                       "load the Slurm environment, or install slurm-client")
    return ok("slurm", f"Slurm {version}.{version.patch} (scontrol --version)")


def check_oci_conf(path: Path, text_problems: list[str] | None, version: SlurmVersion) -> Check:
    """Slurm's ``oci.conf`` linted for ``version`` (``runtime oci-conf --check``); None
    problems: the file is not there."""
    if text_problems is None:
        return warn("oci.conf", f"no {path}: `srun/sbatch --container` do not run containers "
                                "on this node",
                    f"as root: ocistage runtime oci-conf --runtime runc > {path}")
    if text_problems:
        more = f" (and {len(text_problems) - 1} more)" if len(text_problems) > 1 else ""
        return warn("oci.conf", f"{path}: {text_problems[0]}{more}",
                    f"see `ocistage runtime oci-conf --check {path}`; a working one: "
                    "`ocistage runtime oci-conf`")
    return ok("oci.conf", f"{path}: no problems for Slurm {version}")


def slurm_conf_location(environ: Mapping[str, str],
                        scontrol_config: str | None) -> tuple[Path | None, str]:
    """The slurm.conf this node's Slurm reads (oci.conf sits beside it) and how it was found:
    ``$SLURM_CONF``, else what ``scontrol show config`` (``scontrol_config``, None when it
    printed nothing) says; never a guess (``/etc/slurm`` may hold another cluster's files
    beside a prefix-built Slurm). None with the reason when neither tells."""
    conf = environ.get("SLURM_CONF")
    if conf:
        return Path(conf), "$SLURM_CONF"
    match = _SLURM_CONF_LINE.search(scontrol_config or "")
    if match is not None:
        return Path(match.group(1)), "scontrol show config"
    said = (scontrol_config or "").strip().splitlines()
    return None, said[-1] if said else "scontrol show config printed nothing"


def check_oci_conf_location(conf: Path | None, how: str) -> Check | None:
    """A warning when doctor cannot read the oci.conf slurmstepd reads on this node: where the
    configuration is not known, or not here (a configless node gets it from slurmctld and
    keeps it in slurmd's cache; a login node may have none); None when it can."""
    if conf is None:
        return warn("oci.conf", f"cannot tell where this Slurm's configuration is: SLURM_CONF "
                                f"is not set and scontrol show config did not say ({how})",
                    "set SLURM_CONF to the cluster's slurm.conf, or run doctor where slurmctld "
                    "answers; oci.conf is read on the compute nodes: check it there with "
                    "`ocistage runtime oci-conf --check PATH`")
    if not conf.parent.is_dir():
        return warn("oci.conf", f"this node has no {conf.parent} (from {how}): configless "
                                "Slurm keeps its files on the compute nodes",
                    "check oci.conf on a compute node: `srun ocistage doctor`, or "
                    "`ocistage runtime oci-conf --check PATH` there")
    return None


def slurm_checks() -> list[Check]:
    from ocistage.runtimes.errors import SlurmError
    from ocistage.runtimes.oci_conf import lint_oci_conf_file
    from ocistage.runtimes.slurm import installed_version

    try:
        version = installed_version()
    except (SlurmError, OcistageError) as exc:
        return [check_slurm(None, exc.message)]
    checks = [check_slurm(version, None)]
    asked = None if os.environ.get("SLURM_CONF") else command_output(
        ["scontrol", "show", "config"])
    conf, how = slurm_conf_location(os.environ, asked)
    unreadable = check_oci_conf_location(conf, how)
    if unreadable is not None or conf is None:
        return [*checks, *([unreadable] if unreadable else [])]
    path = conf.parent / "oci.conf"
    try:
        problems = ([str(p) for p in lint_oci_conf_file(path, version)]
                    if path.is_file() else None)
    except OcistageError as exc:
        problems = [exc.message]
    checks.append(check_oci_conf(path, problems, version))
    state = check_runtime_state(path, os.geteuid()) if problems is not None else None
    return checks + ([state] if state is not None else [])
