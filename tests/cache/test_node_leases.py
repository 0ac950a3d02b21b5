"""Leases on a node-local copy (``stage --all-nodes``) record their node: GC on another host
(a login node) keeps a dead group of them and reports it as left instead of dropping it (which
would orphan the copy it cannot reach), GC on that node removes the copy, and after
``NODE_COPY_KEEP`` the leases of a node that never came back are dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ocistage.cache.gc import GcOptions, GcReport, collect
from ocistage.cache.leaseexpiry import NODE_COPY_KEEP
from ocistage.cache.leases import (
    Holder,
    Lease,
    StagedPlace,
    all_leases,
    record,
    staged_groups,
)
from ocistage.cache.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "cache")


def gc(store: Store, node: str, monkeypatch: pytest.MonkeyPatch,
       now: float | None = None) -> GcReport:
    """``cache gc`` as run on ``node`` once every job has ended."""
    monkeypatch.setenv("SLURMD_NODENAME", node)
    return collect(store, GcOptions(), job_states=lambda ids: {}, now=now)


def node_lease(store: Store, path: Path, node: str, job: str = "7",
               created: float | None = None) -> Lease:
    """A job's lease on ``path`` as a stager of ``stage --all-nodes`` on ``node`` takes it."""
    place = StagedPlace.of(path)
    lease = Lease(id=f"{node}-{job}", target=place.target, holder=Holder.slurm_job(job),
                  created=1e9 if created is None else created, identity=place.identity,
                  node=node)
    record(store.root, lease)
    return lease


def copy_at(path: Path, lease: Lease) -> Path:
    (path / "rootfs").mkdir(parents=True)
    (path / ".ocistage-staged.json").write_text(json.dumps({"id": lease.id, "source": "x"}))
    return path


def test_gc_elsewhere_keeps_the_dead_leases_of_a_copy_on_another_node_and_says_so(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "local" / "app"
    lease = node_lease(store, path, "n2", created=1e9)
    # this host has a copy of its own at the same path, marked with that very lease: it is
    # not the node's copy, and stays
    copy_at(path, lease)
    report = gc(store, "login", monkeypatch, now=1e9 + 3600)
    assert [r for r in report.removed if r.kind in ("lease", "staged")] == []
    assert all_leases(store.root) == [lease]
    assert path.is_dir()
    [left] = report.left
    assert (left.kind, left.name) == ("staged", f"{path} on node n2")
    assert "cleanup" in left.reason and report.to_json()["left"][0]["name"] == left.name


def test_gc_on_the_node_removes_its_copy_and_drops_the_leases(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "local" / "app"
    here = node_lease(store, path, "n2")
    other = node_lease(store, path, "n3")
    copy_at(path, here)
    report = gc(store, "n2", monkeypatch, now=1e9 + 3600)
    assert {r.name for r in report.removed if r.kind == "staged"} == {str(path)}
    assert not path.exists()
    assert all_leases(store.root) == [other]  # n3's copy is n3's gc's (or cleanup's)
    assert [left.name for left in report.left] == [f"{path} on node n3"]


def test_the_leases_of_a_node_that_never_returns_are_dropped_after_the_keep_time(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "local" / "app"
    lease = node_lease(store, path, "n9", created=1e9)
    report = gc(store, "login", monkeypatch, now=1e9 + NODE_COPY_KEEP + 1)
    assert {r.name for r in report.removed if r.kind == "lease"} == {lease.id}
    assert "n9" in report.removed[0].reason
    assert all_leases(store.root) == [] and report.left == ()


def test_a_live_lease_on_another_node_keeps_only_that_nodes_copy(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "local" / "app"
    mine = node_lease(store, path, "n1", job="7")
    node_lease(store, path, "n2", job="8")
    copy_at(path, mine)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    report = collect(store, GcOptions(), job_states=lambda ids: {"8": "RUNNING"}, now=1e9)
    assert not path.exists()  # job 8 runs on n2's copy, not this one
    assert {r.name for r in report.removed if r.kind == "lease"} == {mine.id}


def test_groups_are_per_node_and_a_lease_without_node_joins_this_nodes() -> None:
    def lease(lease_id: str, node: str) -> Lease:
        return Lease(id=lease_id, target="staged:/local/app", holder=Holder.slurm_job("1"),
                     created=1.0, identity="1:2/app", node=node)

    found = [lease("a", "n1"), lease("b", "n2"), lease("c", ""), lease("d", "n2"),
             lease("e", "n3")]
    groups = {tuple(x.id for x in group) for group in staged_groups(found, here="n1")}
    assert groups == {("a", "c"), ("b", "d"), ("e",)}


def test_a_place_does_not_see_the_leases_other_nodes_recorded(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "app"
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    local = StagedPlace.of(path, local=True).acquire(store.root, Holder.slurm_job("3"))
    shared = StagedPlace.of(path).acquire(store.root, Holder.slurm_job("4"))
    assert (local.node, shared.node) == ("n1", "")
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    place = StagedPlace.of(path)
    assert [place.held_by(x) for x in (local, shared)] == [False, True]
    assert Lease.from_json(local.to_json()) == local
    assert "node" not in json.loads(shared.to_json())  # what an earlier release wrote
