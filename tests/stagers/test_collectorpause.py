"""ocistage.stagers.collectorpause: a stage runs without automatic cyclic collection, and leaves the
collector
as it found it (also after an error)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache.leases import Holder
from ocistage.stagers import directory as stage_module
from ocistage.stagers.collectorpause import cyclic_gc_paused
from ocistage.stagers.directory import stage_directory


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_collector_is_restored_as_it_was(collector_on: None) -> None:
    with pytest.raises(RuntimeError), cyclic_gc_paused():
        assert not gc.isenabled()
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    with cyclic_gc_paused():
        pass
    assert not gc.isenabled()  # a caller that had turned it off keeps it off


def test_a_stage_builds_with_the_collector_paused(tree: Path, tmp_path: Path,
                                                  collector_on: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    real = stage_module._stage_tree

    def spying(*args: object, **kwargs: object) -> object:
        seen.append(gc.isenabled())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(stage_module, "_stage_tree", spying)
    stage_directory(tree, tmp_path / "to", cache_root=tmp_path / "cache",
                    holder=Holder.pin("test"))
    assert seen == [False]
    assert gc.isenabled()
