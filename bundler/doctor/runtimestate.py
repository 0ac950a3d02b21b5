"""``doctor``'s runtime-state check: does the runtime root in this node's ``oci.conf`` work
for the caller as a job user, and is it the caller's alone (runtimes/runtime_state.py)."""

from __future__ import annotations

from pathlib import Path

from ocistage.bundler.doctor.report import Check, ok, warn
from ocistage.errors import OcistageError

NAME = "runtime_state"


def check_runtime_state(path: Path, uid: int) -> Check | None:
    """The check for the ``oci.conf`` at ``path`` (None when it cannot be read or its runtime
    takes no ``--root``: the oci.conf check says so)."""
    from ocistage.runtimes.oci_conf import parse_oci_conf
    from ocistage.runtimes.runtime_state import judge_oci_conf_root

    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 20)
    except OSError:
        return None
    try:
        entries, _ = parse_oci_conf(text)
        finding = judge_oci_conf_root(entries, uid)
    except OcistageError as exc:
        return warn(NAME, exc.message, exc.hint or "see `ocistage runtime oci-conf --check`")
    if finding is None:
        return None
    if finding.fix is None:
        return ok(NAME, finding.detail)
    return warn(NAME, finding.detail, finding.fix)
