"""The goal table of ``python -m bench goals`` (bench/goals.py): its verdicts and its rendering;
nothing is timed or measured."""

from __future__ import annotations

from bench.goals import CLUSTER_ONLY, Goal, not_measured, ratio, render


def test_verdicts_follow_the_sense_of_each_goal() -> None:
    assert Goal("floor", 1.0, "<=", 0.98).verdict == "met"
    assert Goal("floor", 1.0, "<=", 1.0).verdict == "met"
    assert Goal("floor", 1.0, "<=", 1.01).verdict == "missed"
    assert Goal("umoci", 3.0, ">=", 3.2).verdict == "met"
    assert Goal("umoci", 3.0, ">=", 2.9).verdict == "missed"
    assert Goal("rss", 150, "<", 150, unit="MB").verdict == "missed"
    assert Goal("rss", 150, "<", 149, unit="MB").verdict == "met"


def test_a_goal_without_a_number_is_not_a_verdict_on_ocistage() -> None:
    failed = Goal("umoci", 3.0, ">=", float("nan"))
    assert failed.verdict.startswith("failed: no successful run")
    assert failed.shown == "-"
    assert Goal("umoci", 3.0, ">=", None, detail="exit 1").verdict == \
        "failed: no successful run (exit 1)"
    gone = not_measured("kernel", 1.6, "needs root")
    assert gone.verdict == "not measurable here: needs root"
    assert gone.shown == "-"


def test_ratio_refuses_what_is_no_ratio() -> None:
    assert ratio(2.0, 1.0) == 2.0
    assert ratio(None, 1.0) is None
    assert ratio(1.0, 0.0) is None
    assert ratio(float("nan"), 1.0) is None
    assert ratio(1.0, float("nan")) is None


def test_the_table_has_one_row_per_goal_and_its_details() -> None:
    goals = [Goal("cold bundle / floor", 1.0, "<=", 0.614, "1.2 / 1.9"),
             Goal("peak RSS", 150, "<", 68.6, unit="MB"),
             *(not_measured(name, limit, why) for name, limit, why in CLUSTER_ONLY)]
    text = render(goals, "header")
    lines = text.splitlines()
    assert lines[0] == "header"
    assert lines[1].split() == ["goal", "measured", "target", "verdict"]
    row = next(line for line in lines if line.startswith("cold bundle / floor"))
    assert row.split()[-4:] == ["0.614x", "<=", "1x", "met"]
    assert any(line.startswith("peak RSS") and "69 MB" in line and "< 150 MB" in line
               for line in lines)
    assert sum("not measurable here: needs the root Slurm clusters" in line
               for line in lines) == len(CLUSTER_ONLY)
    assert "  cold bundle / floor: 1.2 / 1.9" in lines
