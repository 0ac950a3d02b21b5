"""ocistage.stagers.collectorpause: a stage runs without automatic cyclic collection, and leaves
the collector as it found it (also after an error)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.stagers.collectorpause import cyclic_gc_paused


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


#: run in a child (an audit hook cannot be removed again): stages TREE into TO, recording for
#: every file-system change it makes whether automatic cyclic collection was on
_STAGE_AND_WATCH = """
import gc, json, sys
from pathlib import Path
from ocistage.cache.leases import Holder
from ocistage.stagers.directory import stage_directory

tree, to, cache = map(Path, sys.argv[1:4])
CHANGES = {"open", "os.mkdir", "os.link", "os.symlink", "os.rename", "os.replace"}
seen = []
watching = False

def hook(event, args):
    if watching and event in CHANGES:
        seen.append([event, gc.isenabled()])

sys.addaudithook(hook)
gc.enable()
watching = True
stage_directory(tree, to, cache_root=cache, holder=Holder.pin("test"))
watching = False
print(json.dumps({"seen": seen, "after": gc.isenabled()}))
"""


def test_a_stage_changes_the_file_system_with_the_collector_paused(tree: Path,
                                                                   tmp_path: Path) -> None:
    """Seen from outside: every directory, file, link and rename a stage makes happens with
    automatic cyclic collection off, and it is on again when the stage returns."""
    to = tmp_path / "to"
    child = subprocess.run([sys.executable, "-c", _STAGE_AND_WATCH, str(tree), str(to),
                            str(tmp_path / "cache")], capture_output=True, text=True,
                           timeout=120, check=True)
    report = json.loads(child.stdout)
    events = {event for event, _enabled in report["seen"]}
    assert {"os.mkdir", "os.link", "os.rename"} <= events  # it did build and publish
    assert [(event, enabled) for event, enabled in report["seen"] if enabled] == []
    assert report["after"] is True
    assert (to / "bundle" / "config.json").is_file()
