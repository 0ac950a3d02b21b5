"""Streamed, snapshot-backed bundles against the real registry and the fault proxy.

- warm bundles (from snapshots, by hard links) hold the same tree as cold ones (but for the
  owner's read bit on the files that lack it, kept in the snapshot: cache/snapshotmodes.py),
  writable ones exactly;
- an image sharing base layers with a cached one fetches and unpacks only its new layers;
- kill -9 in the middle of a streamed bundle publishes nothing, and the rerun completes;
- a corrupt download that is being unpacked is retried or refused, never published.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from ocistage.bundler.flows.bundle import BundleResult, make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.cache.linkprobes import reflinks_work
from ocistage.cache.snapshots import list_snapshots
from ocistage.cache.store import Store
from ocistage.errors import IntegrityError, LayerError
from pytest_ocistage.faultproxy import Fault, FaultProxy
from pytest_ocistage.images import ImageRef
from tests.bundler.tarbuilder import Node, owner_readable, snapshot, with_mount_points
from tests.e2e.conftest import OcistageRunner


def tree(rootfs: Path) -> dict[str, Node]:
    """The tree, ignoring hardlink "groups" of one name (linked files share their inode
    with the snapshot, outside the tree)."""
    return {name: node[:5] if len(node) == 6 and len(node[5]) == 1 else node  # type: ignore[arg-type]
            for name, node in snapshot(rootfs).items()}


def bundle(ref: str, cache: Path, dest: Path | None, link: bool = False) -> BundleResult:
    return make_bundle(parse_reference(ref), Store.open(cache), dest, link=link)


def test_warm_bundles_hold_the_same_tree_as_cold_ones(images: dict[str, ImageRef],
                                                      ocistage: OcistageRunner,
                                                      tmp_path: Path) -> None:
    image = images["multilayer"]
    cold = ocistage("bundle", image.ref, str(tmp_path / "cold"), check=True)
    expected = tree(Path(cold.stdout.strip()) / "rootfs")
    cached = json.loads(ocistage("bundle", "--json", image.ref, check=True).stdout)
    assert cached["reused"] is False
    # the cold DEST kept no snapshot unless copies from the cache are reflinks (keeping one
    # would write the tree twice): then the cached bundle unpacked, once
    keeps = reflinks_work(Store.open(ocistage.cache).tmp_dir, tmp_path)
    assert cached["layers_applied"] == (0 if keeps else len(image.layer_digests))
    assert tree(Path(cached["path"]) / "rootfs") == owner_readable(expected)
    warm = bundle(image.ref, ocistage.cache, tmp_path / "warm", link=True)
    assert warm.layers_applied == 0  # everything came from the snapshot
    assert tree(warm.path / "rootfs") == owner_readable(expected)
    config = json.loads((warm.path / "config.json").read_text())
    assert config["root"]["readonly"] is True  # the files are shared with the cache
    [snap] = list_snapshots(Store.open(ocistage.cache))
    assert (warm.path / "rootfs/etc/passwd").stat().st_ino == \
        (snap.rootfs / "etc/passwd").stat().st_ino
    # a writable DEST is a private copy of the same snapshot: nothing unpacked, no inode shared
    copy = bundle(image.ref, ocistage.cache, tmp_path / "copy")
    assert copy.layers_applied == 0
    assert tree(copy.path / "rootfs") == expected
    assert json.loads((copy.path / "config.json").read_text())["root"]["readonly"] is False
    assert (copy.path / "rootfs/etc/passwd").stat().st_ino != \
        (snap.rootfs / "etc/passwd").stat().st_ino
    (copy.path / "rootfs/etc/passwd").write_text("changed\n")  # the cache's tree is not
    assert (snap.rootfs / "etc/passwd").read_text() != "changed\n"


def test_keep_snapshot_makes_a_cold_dest_the_last_unpack(images: dict[str, ImageRef],
                                                          ocistage: OcistageRunner,
                                                          tmp_path: Path) -> None:
    """`bundle --keep-snapshot REF DEST`: the image is unpacked into a snapshot kept in the
    cache and DEST is a private copy of it; the cached and linked bundles after it unpack
    nothing."""
    image = images["multilayer"]
    cold = json.loads(ocistage("bundle", "--json", "--keep-snapshot", image.ref,
                               str(tmp_path / "cold"), check=True).stdout)
    assert cold["layers_applied"] == len(image.layer_digests)
    [snap] = list_snapshots(Store.open(ocistage.cache))
    dest = Path(cold["path"]) / "rootfs"
    assert owner_readable(tree(dest)) == with_mount_points(tree(snap.rootfs))
    assert (dest / "data/mode000").stat().st_mode & 0o777 == 0  # the image's mode
    assert (dest / "etc/passwd").stat().st_ino != (snap.rootfs / "etc/passwd").stat().st_ino
    cached = json.loads(ocistage("bundle", "--json", image.ref, check=True).stdout)
    linked = json.loads(ocistage("bundle", "--json", "--link", image.ref,
                                 str(tmp_path / "linked"), check=True).stdout)
    assert (cached["layers_applied"], linked["layers_applied"]) == (0, 0)


def test_keep_snapshot_in_the_config_file_and_its_negation(images: dict[str, ImageRef],
                                                          ocistage: OcistageRunner,
                                                          tmp_path: Path) -> None:
    """``keep_snapshot = true`` in the config file makes every cold ``bundle REF DEST`` keep
    the snapshot; ``--no-keep-snapshot`` overrides it for one command."""
    config = ocistage.home / ".config" / "ocistage" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("keep_snapshot = true\n")
    shown = json.loads(ocistage("config", "show", "--json", check=True).stdout)
    assert shown["settings"]["keep_snapshot"] == {"value": True, "origin": f"file {config}"}
    store = Store.open(ocistage.cache)
    ocistage("bundle", "-q", "--no-keep-snapshot", images["busybox"].ref,
             str(tmp_path / "plain"), check=True)
    keeps = reflinks_work(store.tmp_dir, tmp_path)  # the default's own choice
    assert len(list_snapshots(store)) == (1 if keeps else 0)
    cold = json.loads(ocistage("bundle", "--json", images["multilayer"].ref,
                               str(tmp_path / "kept"), check=True).stdout)
    assert cold["layers_applied"] == len(images["multilayer"].layer_digests)
    assert len(list_snapshots(store)) == (2 if keeps else 1)
    linked = json.loads(ocistage("bundle", "--json", "--link", images["multilayer"].ref,
                                 str(tmp_path / "linked"), check=True).stdout)
    assert linked["layers_applied"] == 0


def test_shared_base_layers_are_fetched_and_unpacked_once(images: dict[str, ImageRef],
                                                          fault_proxy: FaultProxy,
                                                          tmp_path: Path) -> None:
    base, derived = images["busybox"], images["multilayer"]
    shared = len(base.layer_digests)
    assert derived.layer_digests[:shared] == base.layer_digests
    cache = tmp_path / "cache"
    first = bundle(base.via(fault_proxy.host), cache, None)
    assert first.layers_applied == shared
    before = len(fault_proxy.requests)
    second = bundle(derived.via(fault_proxy.host), cache, None)
    fetched = [r.path.rsplit("/", 1)[-1] for r in fault_proxy.requests[before:]
               if r.method == "GET" and "/blobs/" in r.path]
    assert sorted(d for d in fetched if d in derived.layer_digests) == \
        sorted(derived.layer_digests[shared:])
    assert second.layers_applied == len(derived.layer_digests) - shared
    reference = bundle(derived.ref, tmp_path / "fresh", tmp_path / "reference")
    assert reference.layers_applied == len(derived.layer_digests)
    assert tree(second.path / "rootfs") == owner_readable(tree(reference.path / "rootfs"))


def test_kill_9_during_a_streamed_bundle_publishes_nothing(images: dict[str, ImageRef],
                                                           ocistage: OcistageRunner,
                                                           fault_proxy: FaultProxy,
                                                           tmp_path: Path) -> None:
    image = images["multilayer"]
    layer = image.layer_digests[0]  # busybox's layer: bin/busybox comes first
    fault_proxy.add(Fault(rf"/blobs/{layer}", "stall", after_bytes=300_000))
    child = subprocess.Popen([*ocistage.command, "bundle", image.via(fault_proxy.host)],
                             env=ocistage.environment(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    scratch_bin = ocistage.cache / "tmp"
    deadline = time.monotonic() + 60
    # unpacking starts while the layer is still downloading (the download is stalled)
    while not list(scratch_bin.glob("snapshot-*/rootfs/bin")):
        assert time.monotonic() < deadline, "unpacking never started during the download"
        assert child.poll() is None, child.communicate()
        time.sleep(0.05)
    assert (ocistage.cache / "ingest" / f"{layer[7:]}.partial").exists()
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    store = Store.open(ocistage.cache)  # cleans the dead process's scratch
    assert list_snapshots(store) == []
    bundles = ocistage.cache / "bundles"
    assert not bundles.exists() or not [p for p in bundles.iterdir()
                                        if (p / "config.json").exists()]
    assert not list((ocistage.cache / "tmp").iterdir())
    assert not (ocistage.cache / "blobs/sha256" / layer[7:]).exists()
    fault_proxy.clear()
    rerun = json.loads(ocistage("bundle", "--json", image.via(fault_proxy.host),
                                check=True).stdout)
    reference = bundle(image.ref, tmp_path / "fresh", tmp_path / "reference")
    assert tree(Path(rerun["path"]) / "rootfs") == \
        owner_readable(tree(reference.path / "rootfs"))


def test_corrupt_download_being_unpacked_is_retried_or_refused(images: dict[str, ImageRef],
                                                               fault_proxy: FaultProxy,
                                                               tmp_path: Path) -> None:
    image = images["multilayer"]
    layer = image.layer_digests[0]
    # one corrupt transfer: the streamed unpack sees bad bytes, the pull refetches the blob,
    # and the layer is unpacked again from the verified blob
    fault_proxy.add(Fault(rf"/blobs/{layer}", "flip", after_bytes=150_000, times=1))
    good = bundle(image.via(fault_proxy.host), tmp_path / "cache", tmp_path / "good")
    reference = bundle(image.ref, tmp_path / "fresh", tmp_path / "reference")
    assert tree(good.path / "rootfs") == tree(reference.path / "rootfs")
    # always corrupt: refused, nothing published
    fault_proxy.add(Fault(rf"/blobs/{layer}", "flip", after_bytes=150_000, times=100))
    cache = tmp_path / "cache-bad"
    for dest in (tmp_path / "bad", None):
        try:
            bundle(image.via(fault_proxy.host), cache, dest, link=dest is None)
        except (IntegrityError, LayerError) as exc:
            assert "digest" in str(exc) or "corrupt" in str(exc)
        else:
            raise AssertionError("a corrupt layer was accepted")
    assert not (tmp_path / "bad").exists()
    assert list_snapshots(Store.open(cache)) == []
    assert not list((cache / "tmp").iterdir())


def test_pull_missing_bundles_a_cached_image_without_the_registry(
        images: dict[str, ImageRef], ocistage: OcistageRunner, fault_proxy: FaultProxy,
        tmp_path: Path) -> None:
    image = images["busybox"]
    ref = image.via(fault_proxy.host)
    refused = ocistage("bundle", "--pull", "never", ref, str(tmp_path / "b0"))
    assert refused.returncode == 1
    assert "is not in the cache" in refused.stderr and "pull it first" in refused.stderr
    assert fault_proxy.requests == []  # never: not even a ping
    ocistage("pull", ref, check=True)
    fault_proxy.clear()
    fault_proxy.add(Fault(r".", "status", status=404, times=1000))  # the registry is gone
    for policy in ("missing", "never"):
        made = ocistage("bundle", "--json", "--pull", policy, ref, str(tmp_path / policy),
                        check=True)
        report = json.loads(made.stdout)
        assert report["image"]["fetched_bytes"] == 0
        assert (tmp_path / policy / "rootfs" / "bin" / "busybox").is_file()
    assert fault_proxy.requests == []
    down = ocistage("bundle", "--pull", "always", ref, str(tmp_path / "always"))
    assert down.returncode == 1  # the default asks the registry, which is gone


def test_a_warm_bundle_asking_the_registry_loads_only_the_http_client_more(
        images: dict[str, ImageRef], ocistage: OcistageRunner) -> None:
    """G4 with the tag re-resolved (docs/performance.md): a warm ``bundle --json REF`` asks
    the registry for the tag's manifest and finds its bundle in the cache. Of what a warm
    bundle does without (tests/bundler/test_cli_imports.py) it loads the HTTP client alone:
    no credential store (this registry asks for no credentials), signature machinery,
    config writer or thread pool."""
    import sys

    from tests.bundler.test_cli_imports import _PROBE, WARM_BUNDLE_DOES_WITHOUT

    image = images["multilayer"]
    argv = ["bundle", "--json", image.ref]
    assert ocistage(*argv, check=True).json["reused"] is False
    result = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argv)],
                            cwd=ocistage.cwd, env=ocistage.environment(), capture_output=True,
                            text=True, timeout=120, check=False)
    marker = result.stderr.rfind("MODULES ")
    assert result.returncode == 0 and marker >= 0, result.stderr
    assert json.loads(result.stdout)["reused"] is True
    loaded = set(json.loads(result.stderr[marker + len("MODULES "):]))
    assert {"requests", "ocistage.bundler.registry.client"} <= loaded
    # what the HTTP client brings itself (requests imports tempfile and socket)
    client_brings = {"requests", "urllib3", "ocistage.bundler.registry.client", "tempfile",
                     "socket"}
    assert sorted((WARM_BUNDLE_DOES_WITHOUT - client_brings) & loaded) == []
