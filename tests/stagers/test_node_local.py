"""Node-local copies (``stage --all-nodes``): their leases record the node, so the copies that
one path names on several nodes do not hold each other, and a job's cleanup on a node removes
that node's copy even where the cache is not there."""

from __future__ import annotations

from pathlib import Path

import pytest

from ocistage.cache.leases import Holder, StagedPlace, all_leases
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.unstage import unstage

JOB = Holder.slurm_job("7")


def stage_on(node: str, tree: Path, to: Path, cache: Path,
             monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLURMD_NODENAME", node)
    return Path(stage_directory(tree, to, cache_root=cache, name="app", holder=JOB,
                                local=True).path)


def test_each_node_holds_its_own_copy_with_a_lease_of_its_own(
        tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    stage_on("n1", tree, tmp_path / "local", cache, monkeypatch)
    stage_on("n2", tree, tmp_path / "local", cache, monkeypatch)  # the same path, "elsewhere"
    assert sorted(lease.node for lease in all_leases(cache)) == ["n1", "n2"]


def test_another_nodes_removal_in_progress_does_not_keep_this_nodes_copy(
        tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One srun of ``unstage`` over the nodes: n1's unstage holds a (live) removal lease on the
    same path while n2's runs; it is on n1's copy, not n2's (the race issue 38 saw)."""
    cache = tmp_path / "cache"
    path = stage_on("n2", tree, tmp_path / "local", cache, monkeypatch)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    StagedPlace.of(path, local=True).acquire(cache, Holder.this_process())
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    assert unstage(path, cache_root=cache, holder=JOB) is True
    assert not path.exists()
    assert [lease.node for lease in all_leases(cache)] == ["n1"]


def test_the_cleanup_removes_the_copy_where_the_cache_is_not_there(
        tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = stage_on("n2", tree, tmp_path / "local", tmp_path / "cache", monkeypatch)
    (tmp_path / "unmounted").write_text("")  # nothing can be made under a file, even by root
    assert unstage(path, cache_root=tmp_path / "unmounted" / "cache", holder=JOB) is True
    assert not path.exists()
