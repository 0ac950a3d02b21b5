"""``diagnose()``: every check of the doctor run in order, one group per subject, into one
:class:`~ocistage.bundler.doctor.report.DoctorReport`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ocistage.bundler.doctor.namespaces import namespace_checks
from ocistage.bundler.doctor.probes import user_name
from ocistage.bundler.doctor.registry import registry_checks
from ocistage.bundler.doctor.report import DoctorReport
from ocistage.bundler.doctor.runtimes import runtime_checks
from ocistage.bundler.doctor.settings import settings_checks
from ocistage.bundler.doctor.slurm import slurm_checks
from ocistage.bundler.doctor.squashfs import squashfs_checks

if TYPE_CHECKING:
    from ocistage.bundler.settings import Settings


@dataclass(frozen=True)
class DoctorOptions:
    """What to check beyond the host: a stage target other than the configured one, a
    registry (``host[:port]``)."""

    stage_to: str | None = None
    registry: str | None = None


def diagnose(load: Callable[[], Settings],
             options: DoctorOptions = DoctorOptions()) -> DoctorReport:
    """Every check of this host for the caller (``load``: the settings, as the other
    commands build them)."""
    uid = os.geteuid()
    settings, checks = settings_checks(load, options.stage_to)
    checks += registry_checks(settings, options.registry)
    for group in (runtime_checks(uid), namespace_checks(uid), squashfs_checks(uid),
                  slurm_checks()):
        checks += group
    return DoctorReport(user_name(uid), uid, tuple(checks))
