"""What ``python -m bench pyxisnodes`` says of its runs (bench/pyxisnodes.py): the medians, the
N3/N1 ratio against G9's 1.3 and the importer's share; nothing is timed."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.pyxisnodes import (
    Run,
    cpu_seconds,
    phases,
    ratios,
    render,
    render_phases,
    summary,
    timing_importer,
)


def _run(case: str, seconds: float, ok: bool = True, rep: int = 0) -> Run:
    imports = [("n1", "get", 0.1, seconds - 0.5, 2.0), ("-", "release", seconds - 0.2,
                                                        seconds - 0.1, 0.05)]
    if case.startswith("N3"):
        imports += [("n2", "get", 0.1, seconds - 0.6, 0.1), ("n3", "get", 0.2, 0.3, 0.1)]
    return Run("synthetic", "root", case, rep, seconds, ok, "" if ok else "boom",
               1 if "cold" in case else 0, 8, 1, 7, imports)


def test_the_ratio_is_of_the_medians_of_the_good_runs_and_judged_against_the_goal() -> None:
    runs = [_run("N1 cold", 10.0), _run("N1 cold", 12.0, rep=1), _run("N1 cold", 99.0, ok=False),
            _run("N3 cold", 14.0), _run("N3 cold", 16.0, rep=1), _run("N3 warm", 2.0)]
    rows = summary(runs)
    assert [(r["case"], r["seconds"], r["failed"]) for r in rows] == [
        ("N1 cold", 11.0, 1), ("N3 cold", 15.0, 0), ("N3 warm", 2.0, 0)]
    assert ratios(rows) == {("synthetic", "root"): 15.0 / 11.0}
    table = render(rows)
    assert "N3 cold / N1 cold, synthetic, root: 1.36 (goal <= 1.3: missed)" in table
    assert "(1 of 3 failed)" in table


def test_the_importers_share_is_its_longest_get_and_all_its_cpu() -> None:
    run = _run("N3 cold", 10.0)
    assert run.get_seconds == 9.5 - 0.1
    assert abs(run.importer_cpu - 2.25) < 1e-9


def test_dash_times_fields_are_seconds() -> None:
    assert cpu_seconds("0m0.170000s", "1m2.500000s") == 0.17 + 62.5


def test_the_timing_wrapper_passes_the_output_and_the_exit_code_and_logs(tmp_path: Path) -> None:
    importer = tmp_path / "importer"
    importer.write_text('#!/bin/sh\necho "/store/$2.sqsh"\nexit 3\n')
    importer.chmod(0o755)
    with timing_importer(importer) as (wrapper, log):
        done = subprocess.run([str(wrapper), "get", "image"], capture_output=True, text=True,
                              env={"SLURMD_NODENAME": "n2", "PATH": "/usr/bin:/bin"},
                              check=False)
        assert (done.returncode, done.stdout) == (3, "/store/image.sqsh\n")
        node, command, start, end, user, system = log.read_text().split()
    assert (node, command) == ("n2", "get") and float(end) >= float(start)
    assert cpu_seconds(user, system) >= 0


def test_the_phases_split_a_step_at_the_importers_commands() -> None:
    run = Run("busybox", "root", "N3 cold", 0, 2.0, True, imports=[
        ("n1", "get", 0.05, 0.85, 0.4), ("n2", "get", 0.06, 0.95, 0.08),
        ("n3", "get", 0.05, 0.90, 0.08), ("-", "release", 1.30, 1.50, 0.05),
        ("-", "release", 1.40, 1.70, 0.05)])
    found = phases(run)
    assert found is not None
    expected = {"to get": 0.05, "gets": 0.90, "builder": 0.80, "waiter lag": 0.10,
                "pyxis": 0.35, "releases": 0.40, "release": 0.25}
    assert {k: round(v, 6) for k, v in found.items()} == expected
    assert phases(Run("none", "root", "N1 plain", 0, 0.1, True)) is None
    assert "busybox    root  N3 cold" in render_phases([run])
