"""What ``python -m bench`` says of its runs: the goal verdicts of ``bench bundle`` and the
atomic floor of ``bench stage`` (bench/bundle.py, bench/stage.py); nothing is timed."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.bundle import goal_lines
from bench.stage import LinkDest, render, summarise
from pytest_ocistage.components import require_binary


def _result(medians: dict[str, float]) -> dict[str, object]:
    return {"medians": {name: {"seconds": s, "max_rss_kib": 50 << 10, "detail": {}}
                        for name, s in medians.items()},
            "image": {"layers": [["sha256:x", "zstd"]], "zstd_window": 2 << 20}}


def test_a_tool_whose_every_run_failed_is_said_so_not_missed() -> None:
    # umoci cannot unpack zstd layers: its median is nan, which is no verdict on ocistage
    lines = goal_lines(_result({"ocistage": 1.0, "skopeo+umoci": float("nan"),
                                "podman": 2.0}))
    assert "skopeo+umoci / ocistage nan (no successful run)" in lines
    assert "podman / ocistage 2.000 (goal >= 1.5) met" in lines
    assert not any("MISSED" in line for line in lines)


def test_a_missed_goal_is_missed() -> None:
    lines = goal_lines(_result({"ocistage": 1.0, "podman": 1.2}))
    assert "podman / ocistage 1.200 (goal >= 1.5) MISSED" in lines


def test_the_atomic_floor_is_summarised_against_in_place_rsync() -> None:
    samples = {"changed": {"lib": [1.0], "cli": [1.2], "rsync": [0.5], "linkdest": [4.0],
                           "linkdest_rm": [4.5], "linkfarm": [1.1, 1.0, 1.3],
                           "cpal": [0.8], "cli_whole": [1.65]}}
    summary = summarise(samples)
    assert summary["changed"]["linkfarm_rsync_ratio"] == 2.2
    table = render([{"tree": "synthetic", "target": "tmpfs", "files": 100,
                     "summary": summary}])
    assert "1.100s    2.20" in table
    # issue 37's goals: the command's return against cp -al, the whole work (its remover
    # done) against the atomic floor; 2x in-place rsync is withdrawn
    assert "cli/cp -al 1.50 (goal <= 1.3) MISSED" in table
    assert "cli_whole/cp -al+rm 1.50 (goal <= 1.5) OK" in table
    assert "cli/rsync" not in table.split("goals", 1)[1]


def test_the_link_dest_peer_keeps_one_complete_tree_and_no_floor_copy(tmp_path: Path) -> None:
    require_binary("rsync")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("one")
    peer = LinkDest(src, tmp_path / "peer")
    peer.first()
    (src / "d" / "f").write_text("two, longer")  # another size: rsync sees it
    copy, removal, floor, cpal = peer.restage()
    assert min(copy, removal, floor, cpal) >= 0
    assert cpal <= floor
    assert sorted(p.name for p in tmp_path.iterdir()) == ["peer-1", "src"]
    assert (tmp_path / "peer-1" / "d" / "f").read_text() == "two, longer"
    subprocess.run(["rm", "-rf", str(tmp_path / "peer-1")], check=True)
