"""A group-shared cache that its members and root use at once, end to end (issue 39, item 2):
images from the registry (one with files in 0700 directories, as Debian's ``/root``), members
who are real users (:mod:`tests.groupcache`), one member's ``cache gc`` killed with SIGKILL
halfway through a removal, another's importer. Nobody's next command may fail for it, nothing
healthy is quarantined, and root's gc empties the cache."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_ocistage.components import Registry, require_binary
from pytest_ocistage.imagebuild import Dir, Entry, File, busybox_layer
from pytest_ocistage.images import ImageRef
from pytest_ocistage.plugin import ImageFactory
from tests.e2e.test_cache import PAUSING_CLI
from tests.groupcache import GroupCache, group_cache_members


@pytest.fixture
def members() -> Iterator[GroupCache]:
    with group_cache_members() as g:
        yield g


@pytest.fixture
def layered(oci_image: ImageFactory, oci_registry: Registry) -> ImageRef:
    """busybox and a second layer with files in its 0700 /root and in a 0700
    /var/cache/ldconfig, as a Debian image has them; in the registry."""
    second: dict[str, Entry] = {
        "root/.profile": File("PATH=/bin\n"), "root/.cache": Dir(0o755),
        "root/.cache/motd.legal-displayed": File(""),
        "var/cache/ldconfig": Dir(0o700), "var/cache/ldconfig/aux-cache": File("cache\n")}
    built = oci_image([busybox_layer(), second], tag="layered", cmd=["/bin/sh"])
    return built.push(oci_registry, "group/layered", "1")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}", pytrace=False)
        time.sleep(0.05)


def test_a_members_gc_killed_halfway_wedges_nobody(members: GroupCache, layered: ImageRef,
                                                   images: dict[str, ImageRef]) -> None:
    g = members
    busybox, multilayer = layered.ref, images["multilayer"].ref
    g.run(g.b, "bundle", multilayer)             # B's own trees
    g.run(g.a, "bundle", busybox)                # A's, with a 0700 /root in its snapshot
    g.run(g.b, "bundle", "--link", busybox, str(g.b.home / "linked"))
    assert g.entries("quarantine") == {}

    # B's gc --max-size 0, killed in the middle of emptying one of B's own trees (the third
    # directory it removes), after it took A's trees out of their places
    script = g.base / "pausing.py"
    script.write_text(PAUSING_CLI)
    script.chmod(0o644)
    flag = g.b.home / "paused"
    gc = g.start(g.b, "ocistage.cache.treeremoval", "_Removal.rmdir", str(flag), "after:3",
                 "cache", "gc", "--max-size", "0",
                 program=(sys.executable, str(script)))
    wait_for(lambda: flag.exists() or gc.poll() is not None, "B's gc to pause")
    assert gc.poll() is None, gc.communicate()
    g.kill(gc)
    assert gc.returncode == -signal.SIGKILL

    for who in (g.a, g.b, None):   # nobody's next command fails for it
        g.run(who, "cache", "ls")
    g.run(g.a, "bundle", busybox)
    g.run(g.b, "bundle", multilayer)
    g.run(g.b, "bundle", "--link", busybox, str(g.b.home / "linked-again"))
    for who in (g.a, g.b):
        report = json.loads(g.run(who, "cache", "verify", "--json").stdout)
        assert report["ok"] and report["problems"] == [], report
    assert g.entries("quarantine") == {}

    left = g.gc(g.b, "--max-size", "0")["left"]   # exits 0, and says what it left to whom
    assert left and {item["owner_uid"] for item in left} == {g.a.uid}
    assert [name for name, uid in g.entries("tmp").items() if uid == g.b.uid] == []
    g.run(g.a, "bundle", busybox)   # A's next command: A's evicted trees go
    assert [n for n, uid in g.entries("bundles").items()
            if n.startswith(".evicted-") and uid == g.a.uid] == []
    root = g.gc(None, "--max-size", "0")
    assert root["left"] == []
    assert g.entries("bundles") == {} and g.entries("snapshots") == {}
    assert g.entries("tmp") == {}
    report = json.loads(g.run(None, "cache", "verify", "--json").stdout)
    assert report["ok"], report


def test_the_importer_of_a_member_leaves_anothers_snapshot_alone(
        members: GroupCache, layered: ImageRef) -> None:
    """The image's snapshot has 0700 directories with files only its maker (A) reads. B's
    importer `get` on the same cache used to call it changed and quarantine it; now B makes
    its own tree and A's snapshot stays, unquarantined."""
    require_binary("mksquashfs")
    g = members
    image = layered
    g.run(g.a, "bundle", image.ref)
    snapshots = {n: uid for n, uid in g.entries("snapshots").items()}
    assert snapshots and set(snapshots.values()) == {g.a.uid}
    store = g.base / "store-b"
    store.mkdir(mode=0o700)
    os.chown(store, g.b.uid, g.b.gid)
    uri = f"docker://{image.registry.host}#{image.repository}:{image.tag}"
    got = g.run(g.b, "get", uri, program=(sys.executable, "-m", "ocistage.bundler.pyxis.main"),
                env={"OCISTAGE_PYXIS_STORE": str(store)})
    assert Path(got.stdout.strip()).parent == store / "pyxis"
    assert "changed" not in got.stderr
    assert g.entries("quarantine") == {} and g.entries("snapshots") == snapshots
