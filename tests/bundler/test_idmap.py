"""Subordinate-id detection and the mappings that let runc 1.1 run non-root image users."""

from __future__ import annotations

from pathlib import Path

from ocistage.runtimes.idmap import (
    OVERFLOW_ID,
    RootPlaceholder,
    detect_root_placeholder,
    mappings,
    subordinate_start,
)


def test_subordinate_start_by_name_or_uid(tmp_path: Path) -> None:
    subuid = tmp_path / "subuid"
    subuid.write_text("alice:100000:65536\n# comment\nbroken\n1001:300000:0\n1001:400000:10\n")
    assert subordinate_start(subuid, ("alice", "1000")) == 100000
    assert subordinate_start(subuid, ("bob", "1001")) == 400000  # empty range skipped
    assert subordinate_start(subuid, ("carol",)) is None
    assert subordinate_start(tmp_path / "missing", ("alice",)) is None


def test_root_maps_container_root_to_the_overflow_id(tmp_path: Path) -> None:
    assert detect_root_placeholder(0, 0, etc=tmp_path) == RootPlaceholder(OVERFLOW_ID, OVERFLOW_ID)


def test_unprivileged_without_subids_gets_no_placeholder(tmp_path: Path) -> None:
    assert detect_root_placeholder(4321, 4321, etc=tmp_path) is None


def test_unprivileged_with_subids(tmp_path: Path) -> None:
    (tmp_path / "subuid").write_text("4321:100000:65536\n")
    (tmp_path / "subgid").write_text("4321:200000:65536\n")
    found = detect_root_placeholder(4321, 4321, etc=tmp_path)
    # newuidmap/newgidmap come from Debian's uidmap package, which .ci/run installs
    assert found == RootPlaceholder(100000, 200000)


def test_mappings() -> None:
    assert mappings(0, 1000, 65534) == [{"containerID": 0, "hostID": 1000, "size": 1}]
    assert mappings(1000, 1000, None) == [{"containerID": 1000, "hostID": 1000, "size": 1}]
    assert mappings(1000, 0, 65534) == [{"containerID": 1000, "hostID": 0, "size": 1},
                                        {"containerID": 0, "hostID": 65534, "size": 1}]
