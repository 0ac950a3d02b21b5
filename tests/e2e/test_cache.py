"""A cache a whole cluster can share, end to end: `kill -9` at chosen moments of real
`ocistage pull`/`bundle` processes, 8 concurrent bundlers through the fault proxy, GC beside a
running `runc` container, `cache verify` against a flipped byte, and the cache read by skopeo
and umoci as an OCI layout after GC."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ocistage.cache import leases
from ocistage.cache.locks import _process_start_time
from ocistage.cache.refnames import REF_NAME
from ocistage.cache.sizes import format_size
from pytest_ocistage.components import require_binary
from pytest_ocistage.faultproxy import Fault, FaultProxy
from pytest_ocistage.images import ImageRef, host_architecture
from tests.bundler.tarbuilder import Node, owner_readable, snapshot
from tests.e2e.conftest import OcistageRunner

# Runs the CLI with one function replaced by "mark that we got here, then hang", so that the
# test can kill -9 the real process at exactly that point.
PAUSING_CLI = textwrap.dedent("""
    import importlib, sys, time
    module_name, attribute, flag, when, *argv = sys.argv[1:]
    module = importlib.import_module(module_name)
    owner_name, _, name = attribute.rpartition(".")
    owner = getattr(module, owner_name) if owner_name else module
    original = getattr(owner, name)
    after, _, count = when.partition(":")  # "before" or "after:N" (the Nth call)
    calls = []

    def paused(*args, **kwargs):
        calls.append(1)
        if after == "after":
            result = original(*args, **kwargs)
            if len(calls) == int(count or 1):
                open(flag, "w").close()
                time.sleep(3600)
            return result
        open(flag, "w").close()
        time.sleep(3600)

    setattr(owner, name, paused)
    sys.argv = ["ocistage", *argv]
    from ocistage.bundler.cli.app import main
    main()
""")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}", pytrace=False)
        time.sleep(0.05)


def spawn(ocistage: OcistageRunner, argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, env=ocistage.environment(), cwd=ocistage.cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def kill_9(process: subprocess.Popen[str]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL


def assert_cache_clean(ocistage: OcistageRunner) -> None:
    """verify finds nothing; after a gc no leftovers and no leases remain."""
    verify = ocistage("cache", "verify", check=True)
    assert verify.stdout.strip().endswith(": ok"), verify.stdout
    ocistage("cache", "gc", check=True)
    cache = ocistage.cache
    assert list((cache / "tmp").iterdir()) == []
    assert list((cache / "ingest").iterdir()) == []
    assert [p for p in (cache / "bundles").iterdir() if p.name.startswith(".")] == []
    assert not (cache / "leases").exists() or list((cache / "leases").iterdir()) == []


def bundle_json(ocistage: OcistageRunner, ref: str, *extra: str) -> dict[str, object]:
    result = ocistage("bundle", "--json", *extra, ref, check=True)
    value = json.loads(result.stdout)
    assert isinstance(value, dict)
    return value


# -- kill -9 at chosen moments -------------------------------------------------------------------

def test_kill_9_during_a_blob_download(images: dict[str, ImageRef], ocistage: OcistageRunner,
                                       fault_proxy: FaultProxy) -> None:
    image = images["multilayer"]
    big = max(range(len(image.layer_digests)), key=lambda n: layer_size(image, n))
    digest = image.layer_digests[big]
    assert layer_size(image, big) > 300_000
    fault_proxy.add(Fault(f"/blobs/{digest}", "stall", after_bytes=200_000))
    ref = image.via(fault_proxy.host)
    child = spawn(ocistage, [*ocistage.command, "bundle", "-q", ref])
    partial = ocistage.cache / "ingest" / f"{digest.removeprefix('sha256:')}.partial"
    wait_for(lambda: partial.exists() and partial.stat().st_size >= 64 << 10,
             "the stalled download to reach the disk")
    kill_9(child)
    fault_proxy.release_stalled()
    assert not (ocistage.cache / "blobs" / "sha256" / digest.removeprefix("sha256:")).exists()
    made = bundle_json(ocistage, ref)
    assert made["reused"] is False
    resumed = [r for r in fault_proxy.requests if r.path.endswith(digest)][-1]
    assert resumed.headers.get("Range", "").startswith("bytes=")  # resumed, not restarted
    assert (Path(str(made["path"])) / "rootfs" / "bin" / "busybox").is_file()
    assert_cache_clean(ocistage)


def layer_size(image: ImageRef, n: int) -> int:
    blob = image.layout / "blobs" / "sha256" / image.layer_digests[n].removeprefix("sha256:")
    return blob.stat().st_size


KILL_POINTS = {
    # module, attribute, when ("before" the call, or "after:N" the Nth call), command
    "during-layer-extraction": ("ocistage.bundler.unpack.layerchain", "apply_layer", "after:1",
                                "bundle"),
    "snapshot-built-not-published": ("ocistage.bundler.rootfs", "publish_snapshot", "before",
                                     "bundle"),
    "bundle-renamed-not-synced": ("ocistage.bundler.flows.bundle", "fsync_dir", "before", "bundle"),
    "blobs-published-ref-not-tagged": ("ocistage.cache.store", "Store.tag", "before", "pull"),
}


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_kill_9_at_a_chosen_point_then_rerun_completes(
        images: dict[str, ImageRef], ocistage: OcistageRunner, tmp_path: Path,
        point: str) -> None:
    module, attribute, when, command = KILL_POINTS[point]
    image = images["multilayer"]
    flag = tmp_path / "reached"
    child = spawn(ocistage, [sys.executable, "-c", PAUSING_CLI, module, attribute, str(flag),
                             when, command, "-q", image.ref])
    wait_for(lambda: flag.exists() or child.poll() is not None, f"{point} to be reached")
    assert child.poll() is None, child.communicate()
    kill_9(child)
    # the dead process's lease is still on disk: it must not protect anything
    holders = [lease.holder for lease in leases.all_leases(ocistage.cache)]
    assert all(h.kind == "pid" and h.pid == child.pid for h in holders)
    if command == "pull":
        assert ocistage("pull", "-q", image.ref, check=True).stdout.strip() == image.digest
        made = bundle_json(ocistage, image.ref)
    else:
        made = bundle_json(ocistage, image.ref)
    rootfs = Path(str(made["path"])) / "rootfs"
    assert (rootfs / "bin" / "busybox").is_file()
    assert_cache_clean(ocistage)
    assert bundle_json(ocistage, image.ref)["path"] == made["path"]  # still cached after gc


def tree(root: Path) -> dict[str, Node]:
    """The tree's entries; a cached bundle's files are also linked from the snapshot it was
    made from, so a "hardlink group" of one name (links outside the tree) is dropped."""
    return {name: node if len(node) < 6 or len(node[5]) > 1 else node[:5]  # type: ignore[arg-type]
            for name, node in snapshot(root, dir_mtimes=False).items()}


# -- many bundlers, one cache ------------------------------------------------------------------

def test_eight_concurrent_bundlers_download_each_blob_once(
        images: dict[str, ImageRef], ocistage: OcistageRunner, fault_proxy: FaultProxy,
        tmp_path: Path) -> None:
    image = images["multilayer"]
    ref = image.via(fault_proxy.host)
    dests = [None, None, None, None, tmp_path / "d1", tmp_path / "d2", tmp_path / "d3",
             tmp_path / "d4"]
    children = [spawn(ocistage, [*ocistage.command, "bundle", "-q", ref,
                                 *([str(d)] if d else [])]) for d in dests]
    outputs = [child.communicate(timeout=240) for child in children]
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
    paths = [Path(out.strip()) for out, _ in outputs]
    assert len(set(paths[:4])) == 1 and paths[4:] == dests[4:]
    counts = fault_proxy.counts()
    for digest in (*image.layer_digests, image.config_digest):
        assert counts.get(f"/v2/{image.repository}/blobs/{digest}") == 1, (digest, counts)
    cached = tree(paths[0] / "rootfs")
    for dest in paths[4:]:  # DEST has the image's modes, the cached bundle the snapshot's
        assert owner_readable(tree(dest / "rootfs")) == cached
    assert json.loads((paths[4] / "config.json").read_text())["process"] == json.loads(
        (paths[0] / "config.json").read_text())["process"]
    assert_cache_clean(ocistage)


# -- GC beside a running container ----------------------------------------------------------------

@pytest.fixture
def runc_root(tmp_path: Path) -> Iterator[Path]:
    require_binary("runc")
    root = tmp_path / "runc-state"
    yield root
    listed = subprocess.run(["runc", "--root", str(root), "list", "-q"], capture_output=True,
                            text=True)
    for container in listed.stdout.split():
        subprocess.run(["runc", "--root", str(root), "delete", "-f", container],
                       capture_output=True)


def runc_state(root: Path, container: str) -> str:
    result = subprocess.run(["runc", "--root", str(root), "state", container],
                            capture_output=True, text=True)
    return str(json.loads(result.stdout)["status"]) if result.returncode == 0 else "gone"


@pytest.mark.parametrize("holder_kind", ["pid", "pin"])
def test_gc_never_removes_a_leased_bundle_that_runc_runs(
        images: dict[str, ImageRef], ocistage: OcistageRunner, runc_root: Path,
        holder_kind: str) -> None:
    image = images["busybox"]
    # --map-root: runc 1.1 runs an image user other than root for root alone (bundles.py)
    made = bundle_json(ocistage, image.ref, "--map-root", "--cmd",
                       "echo started; exec sleep 300")
    bundle = Path(str(made["path"]))
    container = f"ocistage-gc-{uuid.uuid4().hex[:8]}"
    runc = subprocess.Popen(["runc", "--rootless=true", "--root", str(runc_root), "run",
                             "-b", str(bundle), container], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert runc.stdout is not None
    try:
        assert runc.stdout.readline().strip() == "started"
        target = f"bundle:{bundle.name}"
        holder = (leases.Holder("pid", host=socket.gethostname(), pid=runc.pid,
                                start=_process_start_time(runc.pid))
                  if holder_kind == "pid" else leases.Holder.pin("runc-test"))
        lease = leases.acquire(ocistage.cache, target, holder)
        gc = json.loads(ocistage("cache", "gc", "--max-size", "0", "--json",
                                 check=True).stdout)
        assert target in gc["protected"] and gc["over_budget"] is True
        assert (bundle / "config.json").is_file() and (bundle / "rootfs/bin/busybox").is_file()
        assert runc_state(runc_root, container) == "running"
        listing = json.loads(ocistage("cache", "ls", "--json", check=True).stdout)
        assert listing["images"] == []  # the unleased image went; its bundle stays
        assert [b["key"] for b in listing["bundles"]] == [bundle.name]
        exec_result = subprocess.run(["runc", "--root", str(runc_root), "exec", container,
                                      "cat", "/etc/os-release"], capture_output=True,
                                     text=True, timeout=30)
        assert exec_result.returncode == 0 and "ocistage test busybox" in exec_result.stdout
    finally:
        subprocess.run(["runc", "--root", str(runc_root), "kill", container, "KILL"],
                       capture_output=True)
        runc.communicate(timeout=30)
    if holder_kind == "pin":
        still = json.loads(ocistage("cache", "gc", "--max-size", "0", "--json",
                                    check=True).stdout)
        assert target in still["protected"] and bundle.is_dir()
        leases.release(ocistage.cache, lease.id)
    subprocess.run(["runc", "--root", str(runc_root), "delete", "-f", container],
                   capture_output=True)
    gc = json.loads(ocistage("cache", "gc", "--max-size", "0", "--json", check=True).stdout)
    assert {(r["kind"], r["name"]) for r in gc["removed"]} >= {("bundle", bundle.name)}
    assert not bundle.exists() and gc["over_budget"] is False
    assert leases.all_leases(ocistage.cache) == []


# -- verify --------------------------------------------------------------------------------------

def test_verify_catches_a_flipped_byte(images: dict[str, ImageRef],
                                       ocistage: OcistageRunner) -> None:
    image = images["busybox"]
    ocistage("pull", "-q", image.ref, check=True)
    assert ocistage("cache", "verify", check=True).returncode == 0
    digest = image.layer_digests[0]
    blob = ocistage.cache / "blobs" / "sha256" / digest.removeprefix("sha256:")
    blob.chmod(0o644)
    with open(blob, "r+b") as file:
        file.seek(1234)
        byte = file.read(1)
        file.seek(1234)
        file.write(bytes([byte[0] ^ 0x01]))
    result = ocistage("cache", "verify")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        f"error: cache verify found 2 problems in {ocistage.cache}"]
    assert "hint:" in result.stderr
    assert f"corrupt-blob: {digest}" in result.stdout
    assert f"broken-ref: {image.ref}" in result.stdout
    assert not blob.exists()
    [moved] = list((ocistage.cache / "quarantine").iterdir())
    assert moved.read_bytes() != (image.layout / "blobs/sha256" / blob.name).read_bytes()
    assert json.loads(ocistage("cache", "ls", "--json", check=True).stdout)["images"] == []
    assert ocistage("pull", "-q", image.ref, check=True).stdout.strip() == image.digest
    assert ocistage("cache", "verify", "--json", check=True).returncode == 0


def _write_in_place(path: Path, data: bytes) -> None:
    """What `echo x >> FILE` does to a file of a linked bundle: the shared inode changes."""
    inode = path.stat().st_ino
    with open(path, "ab") as file:
        file.write(data)
    assert path.stat().st_ino == inode


def test_a_write_in_place_through_a_linked_bundle_is_found_and_not_inherited(
        images: dict[str, ImageRef], ocistage: OcistageRunner, tmp_path: Path) -> None:
    """issue 27.14: `bundle --link`, append to a file of its rootfs (the snapshot and the
    cached bundle share the inode): `cache verify` reports it and exits 1, sets the
    snapshot and the cached bundle aside, and the next bundles hold the image's content."""
    image = images["busybox"]
    cached = Path(ocistage("bundle", "-q", image.ref, check=True).stdout.strip())
    linked = tmp_path / "linked"
    ocistage("bundle", "-q", "--link", image.ref, str(linked), check=True)
    original = (linked / "rootfs/etc/passwd").read_bytes()
    assert ocistage("cache", "verify", check=True).returncode == 0
    _write_in_place(linked / "rootfs/etc/passwd", b"intruder:x:0:0::/:/bin/sh\n")
    assert (cached / "rootfs/etc/passwd").read_bytes() != original  # the documented sharing

    result = ocistage("cache", "verify")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "changed-snapshot: sha256:" in result.stdout
    assert "etc/passwd: size" in result.stdout
    assert f"changed-bundle: {cached.name}: " in result.stdout
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        f"error: cache verify found 2 problems in {ocistage.cache}"]
    assert not cached.exists()
    assert sorted(p.name.split("-")[0] for p in (ocistage.cache / "quarantine").iterdir()) == [
        "bundle", "snapshot"]

    again = Path(ocistage("bundle", "-q", image.ref, check=True).stdout.strip())
    assert again == cached and (again / "rootfs/etc/passwd").read_bytes() == original
    fresh = tmp_path / "fresh"
    ocistage("bundle", "-q", "--link", image.ref, str(fresh), check=True)
    assert (fresh / "rootfs/etc/passwd").read_bytes() == original
    assert ocistage("cache", "verify", check=True).returncode == 0
    assert (linked / "rootfs/etc/passwd").read_bytes() != original  # the user's own tree


def test_the_next_linked_bundle_sets_a_changed_snapshot_aside_without_verify(
        images: dict[str, ImageRef], ocistage: OcistageRunner, tmp_path: Path) -> None:
    """Without `cache verify`: the next bundle made from the snapshot checks it first,
    warns, sets it and the cached bundle sharing the change aside and unpacks again."""
    image = images["busybox"]
    first = tmp_path / "first"
    ocistage("bundle", "-q", "--link", image.ref, str(first), check=True)
    cached = Path(ocistage("bundle", "-q", "--env", "A=1", image.ref, check=True).stdout.strip())
    original = (first / "rootfs/etc/os-release").read_bytes()
    with open(first / "rootfs/etc/os-release", "r+b") as file:  # same size, new content
        file.write(original[:8].swapcase())
    second = tmp_path / "second"
    result = ocistage("bundle", "--link", image.ref, str(second), check=True)
    assert "changed since it was published" in result.stderr
    assert (second / "rootfs/etc/os-release").read_bytes() == original
    assert not cached.exists()  # the next `bundle --env A=1 REF` makes it again
    again = Path(ocistage("bundle", "-q", "--env", "A=1", image.ref, check=True).stdout.strip())
    assert (again / "rootfs/etc/os-release").read_bytes() == original
    assert ocistage("cache", "verify", check=True).returncode == 0


# -- the cache stays an OCI layout -----------------------------------------------------------------

def test_skopeo_and_umoci_read_the_cache_after_gc(images: dict[str, ImageRef],
                                                  ocistage: OcistageRunner,
                                                  tmp_path: Path) -> None:
    require_binary("skopeo")
    require_binary("umoci")
    busybox, multilayer = images["busybox"], images["multilayer"]
    ocistage("bundle", "-q", busybox.ref, check=True)
    ocistage("bundle", "-q", multilayer.ref, check=True)
    removed = json.loads(ocistage("cache", "rm", "--json", multilayer.ref, check=True).stdout)
    kinds = {r["kind"] for r in removed["removed"]}
    assert {"ref", "blob", "bundle"} <= kinds
    inspect = subprocess.run(["skopeo", "inspect", f"oci:{ocistage.cache}:{busybox.ref}"],
                             capture_output=True, text=True)
    assert inspect.returncode == 0, inspect.stderr
    assert json.loads(inspect.stdout)["Digest"] == busybox.digest
    gone = subprocess.run(["skopeo", "inspect", f"oci:{ocistage.cache}:{multilayer.ref}"],
                          capture_output=True, text=True)
    assert gone.returncode != 0
    subprocess.run(["umoci", "unpack", "--rootless", "--image",
                    f"{ocistage.cache}:{busybox.ref}", str(tmp_path / "umoci")], check=True,
                   capture_output=True)
    assert (tmp_path / "umoci" / "rootfs" / "bin" / "busybox").is_file()
    layout = json.loads((ocistage.cache / "index.json").read_text())
    assert [m["annotations"][REF_NAME] for m in layout["manifests"]] == [
        f"{busybox.ref}+linux/amd64", busybox.ref]
    ocistage("cache", "gc", "--max-size", "0", check=True)
    assert json.loads((ocistage.cache / "index.json").read_text())["manifests"] == []
    assert json.loads((ocistage.cache / "oci-layout").read_text()) == {
        "imageLayoutVersion": "1.0.0"}


def test_one_name_one_descriptor_for_a_multi_platform_tag(
        images: dict[str, ImageRef], ocistage: OcistageRunner, fault_proxy: FaultProxy,
        tmp_path: Path) -> None:
    """Two platforms of one tag in the cache: REF names an index of them, from which skopeo
    takes the platform asked for (the host's by default); REF+OS/ARCH[/VARIANT] names that
    platform's manifest, which umoci unpacks; `--pull missing` finds each platform without the
    registry; and a cache written before (every platform named REF) is still read, and
    renamed by the next pull."""
    require_binary("skopeo")
    require_binary("umoci")
    image = images["multiarch"]
    ref = image.via(fault_proxy.host)
    for platform in image.platforms:
        ocistage("pull", "-q", "--platform", platform, ref, check=True)

    def names() -> list[str]:
        layout = json.loads((ocistage.cache / "index.json").read_text())
        return [m["annotations"][REF_NAME] for m in layout["manifests"]]

    assert sorted(names()) == sorted([ref, *(f"{ref}+{p}" for p in image.platforms)])
    cache = ocistage.cache
    host = json.loads(subprocess.run(["skopeo", "inspect", f"oci:{cache}:{ref}"],
                                     capture_output=True, text=True, check=True).stdout)
    assert host["Architecture"] == host_architecture()
    for platform, digest in image.platforms.items():
        os_name, arch, *variant = platform.split("/")
        chosen = subprocess.run(["skopeo", "inspect", "--override-os", os_name,
                                 "--override-arch", arch,
                                 *(["--override-variant", variant[0]] if variant else []),
                                 f"oci:{cache}:{ref}"], capture_output=True, text=True)
        assert chosen.returncode == 0, chosen.stderr
        assert json.loads(chosen.stdout)["Architecture"] == arch
        own = subprocess.run(["skopeo", "inspect", "--raw", f"oci:{cache}:{ref}+{platform}"],
                             capture_output=True, check=True).stdout
        assert f"sha256:{hashlib.sha256(own).hexdigest()}" == digest
        unpacked = tmp_path / f"umoci-{arch}"
        umoci = subprocess.run(["umoci", "unpack", "--rootless", "--image",
                                f"{cache}:{ref}+{platform}", str(unpacked)],
                               capture_output=True, text=True)
        assert umoci.returncode == 0, umoci.stderr
        assert (unpacked / "rootfs" / "bin" / "busybox").is_file()

    def pulled_from_cache(policy: str) -> dict[str, str]:
        fault_proxy.clear()
        fault_proxy.add(Fault(r".", "status", status=404, times=1000))  # the registry is gone
        found = {p: ocistage("pull", "-q", "--pull", policy, "--platform", p, ref,
                             check=True).stdout.strip() for p in image.platforms}
        assert fault_proxy.requests == []
        fault_proxy.clear()
        return found

    assert pulled_from_cache("missing") == image.platforms
    # a cache of before: every platform's manifest named REF, no alias
    layout = json.loads((cache / "index.json").read_text())
    old = []
    for entry in layout["manifests"]:
        annotations = entry["annotations"]
        if "io.ocistage.platforms" in annotations:
            continue
        annotations[REF_NAME] = annotations.pop("io.ocistage.ref")
        old.append(entry)
    (cache / "index.json").write_text(json.dumps({**layout, "manifests": old}))
    assert names() == [ref, ref]
    assert pulled_from_cache("never") == image.platforms
    listed = json.loads(ocistage("cache", "ls", "--json", check=True).stdout)["images"]
    assert sorted(i["platform"] for i in listed) == sorted(image.platforms)
    ocistage("pull", "-q", "--platform", "linux/amd64", ref, check=True)
    assert sorted(names()) == sorted([ref, *(f"{ref}+{p}" for p in image.platforms)])
    ocistage("cache", "verify", check=True)


# -- the commands' surface -----------------------------------------------------------------------

def test_ls_du_gc_rm_render_and_fail_cleanly(images: dict[str, ImageRef],
                                             ocistage: OcistageRunner) -> None:
    image = images["busybox"]
    made = bundle_json(ocistage, image.ref)
    ls = ocistage("cache", "ls", check=True).stdout
    assert image.ref in ls and "images" in ls and "bundles" in ls
    du = json.loads(ocistage("cache", "du", "--json", check=True).stdout)
    assert du["blobs"]["count"] == len(image.layer_digests) + 2
    assert du["bundles"]["count"] == 1 and du["total"]["disk"] > du["blobs"]["disk"]
    human = ocistage("cache", "du", check=True).stdout
    assert "blobs" in human and "total" in human
    dry = ocistage("cache", "gc", "--dry-run", "--older-than", "0s", check=True)
    assert "would remove" in dry.stdout and Path(str(made["path"])).is_dir()
    bad = ocistage("cache", "gc", "--max-size", "lots")
    assert bad.returncode == 2 and "error: invalid size 'lots'" in bad.stderr
    missing = ocistage("cache", "rm", "example.com/not/cached:1")
    assert missing.returncode == 1 and "is not in the cache" in missing.stderr
    assert "Traceback" not in missing.stderr + bad.stderr
    removed = ocistage("cache", "rm", image.ref, check=True)
    assert "removed ref" in removed.stdout and not Path(str(made["path"])).exists()
    assert json.loads(ocistage("cache", "ls", "--json", check=True).stdout) == {
        "images": [], "bundles": [], "leases": [], "squashfs": []}


def du(path: Path) -> int:
    out = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0])


def test_gc_says_what_du_then_shows(images: dict[str, ImageRef],
                                    ocistage: OcistageRunner) -> None:
    """`cache gc` on a cache of real bundles (hard links into their snapshots): the dry run
    lists what the real run removes, both give the sizes `du` shows, and a lease that keeps
    the cache over its budget is said."""
    for name in ("busybox", "multilayer"):
        bundle_json(ocistage, images[name].ref)
    for snapshot_json in (ocistage.cache / "snapshots").glob("*/snapshot.json"):
        os.utime(snapshot_json, (1, 1))  # the snapshots go first; their bundles still link them
    before = du(ocistage.cache)
    budget = str(before // 2)
    dry = json.loads(ocistage("cache", "gc", "--dry-run", "--json", "--max-size", budget,
                              check=True).stdout)
    run = ocistage("cache", "gc", "--json", "--max-size", budget, check=True)
    real = json.loads(run.stdout)
    after = du(ocistage.cache)
    assert dry["removed"] == real["removed"] and "snapshot" in {r["kind"] for r in dry["removed"]}
    assert (dry["size_before"], dry["size_after"]) == (real["size_before"], real["size_after"])
    assert (real["size_before"], real["size_after"]) == (before, after)
    assert real["freed"] == before - after
    assert after <= before // 2 and "over its budget" not in run.stderr
    ocistage("pull", "-q", images["busybox"].ref, check=True)
    pulled = json.loads(ocistage("cache", "ls", "--json", check=True).stdout)["images"]
    lease = leases.acquire(ocistage.cache, f"image:{pulled[0]['name']}", leases.Holder.pin("t"))
    over = ocistage("cache", "gc", "--max-size", "1", check=True)
    assert "over its budget of 1 B: what remains is leased or in use" in over.stderr
    assert f"-> {format_size(du(ocistage.cache))}" in over.stdout
    leases.release(ocistage.cache, lease.id)


def test_gc_applies_the_configured_budget(images: dict[str, ImageRef],
                                          ocistage: OcistageRunner) -> None:
    image = images["busybox"]
    ocistage("pull", "-q", image.ref, check=True)
    config = ocistage.home / ".config" / "ocistage" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('max_size = "1G"\n')
    kept = json.loads(ocistage("cache", "gc", "--json", check=True).stdout)
    assert kept["max_size"] == 1 << 30 and kept["removed"] == []
    config.write_text('max_size = "0"\n')
    emptied = json.loads(ocistage("cache", "gc", "--json", check=True).stdout)
    assert emptied["max_size"] == 0 and emptied["size_after"] == emptied["size_floor"]
    assert emptied["over_budget"] is False  # only the layout's directories and records remain
    assert {"ref", "blob"} <= {r["kind"] for r in emptied["removed"]}
    ocistage("pull", "-q", image.ref, check=True)
    override = json.loads(ocistage("cache", "gc", "--json", "--max-size", "1G",
                                   check=True).stdout)
    assert override["max_size"] == 1 << 30 and override["removed"] == []


def test_gc_racing_bundlers_never_breaks_them(images: dict[str, ImageRef],
                                              ocistage: OcistageRunner,
                                              fault_proxy: FaultProxy) -> None:
    """`cache gc --max-size 0` in a loop while bundlers run, one of them stalled mid-download
    for seconds with its other blobs already published but not yet referenced by any ref: the
    bundlers' own leases keep what they use, every bundle succeeds, the cache stays consistent."""
    names = ["busybox", "multilayer", "busybox-zstd", "multilayer-zstd", "busybox-v2s2"]
    stalled = images["multilayer"]
    big = max(range(len(stalled.layer_digests)), key=lambda n: layer_size(stalled, n))
    fault_proxy.add(Fault(f"/blobs/{stalled.layer_digests[big]}", "stall", after_bytes=100_000,
                          stall_seconds=3.0))
    bundlers = [spawn(ocistage, [*ocistage.command, "bundle", "--json",
                                 images[n].via(fault_proxy.host)]) for n in names]
    gc_rounds = 0
    while any(b.poll() is None for b in bundlers):
        result = ocistage("cache", "gc", "--max-size", "0", "-q")
        assert result.returncode == 0, result.stderr
        gc_rounds += 1
    for name, bundler in zip(names, bundlers, strict=True):
        out, err = bundler.communicate()
        assert bundler.returncode == 0, err
        assert json.loads(out)["image"]["digest"] == images[name].digest
    assert gc_rounds >= 3
    assert fault_proxy.count(stalled.layer_digests[big]) == 2  # stalled, then resumed
    assert_cache_clean(ocistage)
    for name in names:  # whatever GC left is complete: bundling again works
        assert Path(str(bundle_json(ocistage, images[name].ref)["path"])).is_dir()
