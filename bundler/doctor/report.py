"""The doctor's report: one :class:`Check` per component or setting (``ok``, ``warn``,
``missing``, with the fix), the :class:`DoctorReport` that ``doctor`` prints and its exit
error."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ocistage.bundler.errors import MissingForCore

if TYPE_CHECKING:
    from ocistage.results import Renderer


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    MISSING = "missing"


@dataclass(frozen=True)
class Check:
    """One line of the report: ``name`` (a component or setting), how it stands, what was
    found, and what to do (``fix``, for warn and missing)."""

    name: str
    status: Status
    detail: str
    fix: str | None = None
    core: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": str(self.status), "detail": self.detail,
                "fix": self.fix, "core": self.core}


def ok(name: str, detail: str, *, core: bool = False) -> Check:
    return Check(name, Status.OK, detail, None, core)


def warn(name: str, detail: str, fix: str, *, core: bool = False) -> Check:
    return Check(name, Status.WARN, detail, fix, core)


def missing(name: str, detail: str, fix: str | None, *, core: bool = False) -> Check:
    return Check(name, Status.MISSING, detail, fix, core)


@dataclass(frozen=True)
class DoctorReport:
    """Every check, in the order run; :attr:`ok` when no core check is missing."""

    user: str
    uid: int
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return not self.core_missing()

    def core_missing(self) -> list[Check]:
        return [c for c in self.checks if c.core and c.status is Status.MISSING]

    def to_json(self) -> dict[str, Any]:
        """What ``doctor --json`` prints."""
        return {"ok": self.ok, "user": self.user, "uid": self.uid,
                "checks": [check.to_json() for check in self.checks]}

    def render(self, out: Renderer) -> None:
        width = max((len(check.name) for check in self.checks), default=0)
        for check in self.checks:
            fix = f"; fix: {check.fix}" if check.fix and check.status is not Status.OK else ""
            out.line(f"{check.status:<7}  {check.name:<{width}}  {check.detail}{fix}")
        others = [c for c in self.checks if not c.core and c.status is Status.MISSING]
        core = self.core_missing()
        if not core:
            out.note("nothing the core commands (pull, bundle, stage, cache) need is missing"
                     + (f"; missing for other uses: {', '.join(c.name for c in others)}"
                        if others else ""))


def core_problem(report: DoctorReport) -> MissingForCore | None:
    """The error ``doctor`` ends with when the core commands lack something, else None."""
    core = report.core_missing()
    if not core:
        return None
    return MissingForCore("missing for pull, bundle, stage or cache: "
                          + ", ".join(c.name for c in core))
