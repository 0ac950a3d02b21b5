"""A group-shared cache with a hostile member: a second uid (``setpriv``, nobody) who can write
``ingest/`` and ``blobs/`` plants a symlink as a partial download, a file of its own there, or
replaces a stored config. None of it may be written through, published or used."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.bundler.flows.bundle import make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.pull import pull
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.cache import leases
from ocistage.cache.digest import Digest
from ocistage.cache.leases import Holder
from ocistage.cache.locks import Owner, owner_is_dead
from ocistage.cache.store import Store
from ocistage.errors import IntegrityError
from pytest_ocistage.components import require_root
from tests.bundler.tarbuilder import build_tar, directory, file, write_oci_layout
from tests.deadline import deadline
from tests.groupcache import GroupCache, group_cache_members

NOBODY = 65534
GROUP = os.getegid()  # the cache's group: the caller's own (the trust rule asks for that)


def as_nobody(*argv: str, input: str | None = None) -> None:
    """Run as another member of the cache's group: uid nobody, gid the caller's group."""
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={GROUP}", "--clear-groups",
                    *argv], check=True, capture_output=True, input=input,
                   text=input is not None)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory nobody can reach, holding a group-shared cache (setgid, group-writable
    directories of the caller's group) that nobody, a member of that group, may write."""
    require_root()  # needs root and setpriv to act as a second user
    base = Path(tempfile.mkdtemp(prefix="ocistage-shared-", dir="/tmp"))
    try:
        base.chmod(0o755)
        store = Store.open(base / "cache")
        for directory in (store.root, store.blobs, store.blobs / "sha256", store.ingest_dir,
                          store.tmp_dir):
            os.chown(directory, -1, GROUP)
            directory.chmod(0o2775)
        yield base
    finally:
        shutil.rmtree(base)


def test_a_planted_partial_symlink_is_not_written_through(shared: Path) -> None:
    store = Store.open(shared / "cache")
    victim = shared / "victim"
    victim.write_bytes(b"root's file\n")
    victim.chmod(0o600)
    data = b"the real blob\n" * 1000
    digest = Digest.of_bytes(data)
    as_nobody("ln", "-s", str(victim), str(store.ingest_dir / f"{digest.hex}.partial"))
    with store.ingest(digest, len(data)) as ingest:
        assert ingest is not None and ingest.offset == 0
        ingest.write(data)
        ingest.commit()
    assert victim.read_bytes() == b"root's file\n"
    assert victim.stat().st_mode & 0o777 == 0o600
    published = store.blob_path(digest)
    assert not published.is_symlink() and published.stat().st_uid == os.geteuid()
    assert published.read_bytes() == data


def test_a_planted_partial_file_is_replaced_not_resumed(shared: Path) -> None:
    store = Store.open(shared / "cache")
    data = b"the real blob\n" * 1000
    digest = Digest.of_bytes(data)
    partial = store.ingest_dir / f"{digest.hex}.partial"
    # nobody's own file holding a correct prefix: resuming would append to a file its owner
    # can rewrite after the digest check
    as_nobody("sh", "-c", f"printf 'the real blob\\n' > {partial}; chmod 666 {partial}")
    with store.ingest(digest, len(data)) as ingest:
        assert ingest is not None and ingest.offset == 0
        ingest.write(data)
        ingest.commit()
    published = store.blob_path(digest)
    assert published.stat().st_uid == os.geteuid() and published.read_bytes() == data


def test_a_replaced_config_is_never_used(shared: Path) -> None:
    layout = shared / "layout"
    write_oci_layout(layout, [build_tar([file("bin/tool", b"tool", mode=0o755)])], tag="t")
    source = parse_reference(f"oci:{layout}:t")
    store = Store.open(shared / "cache")
    image = pull(source, store)
    config = store.blob_path(image.config_digest)
    planted = config.read_bytes().replace(b'"config": {}',
                                          b'"config": {"Cmd": ["/planted"]}')
    assert planted != config.read_bytes()
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={GROUP}", "--clear-groups",
                    "sh", "-c", f"cat > {config}.new && mv -f {config}.new {config}"],
                   input=planted, check=True)
    assert hashlib.sha256(config.read_bytes()).hexdigest() != image.config_digest.hex
    with pytest.raises(IntegrityError, match="does not match its digest"):
        store.read_blob(image.config_digest)
    with pytest.raises(IntegrityError):
        make_bundle(source, store, shared / "bundle",
                    config_options=ConfigOptions(args=["/bin/tool"]))
    assert not (shared / "bundle").exists()
    # a symlink in its place is refused too
    config.unlink()
    as_nobody("ln", "-s", str(layout / "index.json"), str(config))
    with pytest.raises(IntegrityError, match="symbolic link"):
        store.read_blob(image.config_digest)


def test_a_members_fifos_as_lease_and_locks_block_nothing(shared: Path) -> None:
    """A FIFO under a lease's, gc.lock's or a download lock's name: opening it for reading
    used to wait for a writer forever (every pull, bundle and stage waits for GC); now it is
    no lease or lock (skipped, left in place), while a member's real lease still counts."""
    store = Store.open(shared / "cache")
    directory = store.root / "leases"
    leases.acquire(store.root, "image:mine", Holder.pin("me"))
    os.chown(directory, -1, GROUP)
    directory.chmod(0o2775)
    member = leases.Lease(id="0" * 32, target="image:theirs", holder=Holder.pin("them"),
                          created=1.0)
    as_nobody("sh", "-c", f"cat > {directory}/{member.id}.json", input=member.to_json())
    fifos = [directory / f"{'f' * 32}.json", store.root / leases.GC_LOCK,
             store.ingest_dir / f"{'a' * 64}.lock"]
    for fifo in fifos:
        as_nobody("mkfifo", "-m", "666", str(fifo))
    with deadline(20):
        found = leases.all_leases(store.root)
        assert not leases.gc_running(store.root)
        leases.wait_for_gc(store.root)
        assert not owner_is_dead(fifos[2])  # not ours to judge, nor to break
        store.clean_leftovers()
    assert sorted(lease.target for lease in found) == ["image:mine", "image:theirs"]
    assert all(stat.S_ISFIFO(os.lstat(fifo).st_mode) for fifo in fifos)


# -- members who are real users: gc, verify and bundle of one member never break the cache ----
#
# Set up as docs/trust.md says: a root-owned cache of a group, mode 2775; members (users made
# here with useradd, the group a supplementary one) run the real CLI with umask 002. The image
# has a 0700 directory and 0755 inner ones, in two layers (two snapshots).

@pytest.fixture
def group_cache() -> Iterator[GroupCache]:
    """:func:`tests.groupcache.group_cache_members` with an image in ``BASE/layout`` whose
    second layer has 0700 directories (``/root``, ``/var/cache/ldconfig``)."""
    with group_cache_members() as members:
        layout = members.base / "layout"
        write_oci_layout(layout, [
            build_tar([directory("sbin"), file("sbin/tool", b"#!/bin/sh\n", mode=0o755),
                       directory("usr"), directory("usr/lib"),
                       file("usr/lib/libx.so", os.urandom(20_000))]),
            build_tar([directory("root", mode=0o700), directory("root/.cache"),
                       file("root/.profile", b"PATH=/sbin\n"), directory("var"),
                       directory("var/cache"), directory("var/cache/ldconfig", mode=0o700),
                       file("var/cache/ldconfig/aux-cache", b"cache")])],
            tag="t", container={"Cmd": ["/sbin/tool"]})
        yield members


def image(g: GroupCache) -> str:
    return f"oci:{g.base / 'layout'}:t"


def test_a_members_gc_evicts_anothers_trees_and_leaves_the_cache_usable(
        group_cache: GroupCache) -> None:
    """B's `cache gc --max-size 0` over A's bundle and snapshots used to fail halfway
    (`Permission denied`) and leave A's half-removed tree in B's 0700 scratch dir, after which
    every command of A and B failed. Now B evicts them by rename only, exits 0 and says what
    it left to A; A's next command removes them; nothing of anybody's is left in B's dirs."""
    g = group_cache
    g.run(g.a, "bundle", image(g))
    report = g.gc(g.b, "--max-size", "0")
    left = {(item["kind"], item["owner_uid"]) for item in report["left"]}
    assert ("bundle", g.a.uid) in left and ("snapshot", g.a.uid) in left
    assert all(item["owner"].startswith(g.a.name) for item in report["left"])
    text = g.run(g.b, "cache", "gc", "--dry-run").stdout
    assert f"to {g.a.name} (uid {g.a.uid})" in text
    assert [n for n, uid in g.entries("tmp").items() if uid == g.b.uid] == []
    assert not [n for n in g.entries("bundles") if not n.startswith(".")]  # all evicted
    g.run(g.a, "bundle", image(g))   # A's next command: works, and removes A's evicted trees
    assert [n for n in g.entries("bundles") if n.startswith(".evicted-")] == []
    assert [n for n in g.entries("snapshots") if n.startswith(".evicted-")] == []
    g.run(g.b, "bundle", image(g))
    g.gc(g.b, "--max-size", "0")
    g.gc(g.a, "--max-size", "0")    # A removes what B evicted of A's, and its own
    g.run(g.b, "bundle", image(g))
    root = g.gc(None, "--max-size", "0")  # root removes every member's tree, whole
    assert root["left"] == []
    assert g.entries("bundles") == {} and g.entries("snapshots") == {}
    assert g.entries("tmp") == {}


def test_root_gc_removes_a_members_trees_and_follows_no_link(group_cache: GroupCache) -> None:
    """Root is the site admin's exception: its gc removes a member's snapshots and bundles
    whole (it used to refuse a member's entry in the group-writable tmp/ and fail), and
    still never follows a link a member put into their tree."""
    g = group_cache
    bundle = Path(g.run(g.a, "bundle", image(g)).stdout.strip().splitlines()[-1])
    victim = g.cache.parent / "victim"
    victim.mkdir()
    (victim / "keep").write_text("root's\n")
    for link in (bundle / "rootfs" / "sbin" / "escape", bundle / "escape"):
        subprocess.run(["setpriv", f"--reuid={g.a.uid}", f"--regid={g.a.gid}",
                        f"--groups={g.gid}", "ln", "-s", str(victim), str(link)], check=True)
    report = g.gc(None, "--max-size", "0")
    assert (victim / "keep").read_text() == "root's\n"
    assert report["left"] == []
    assert {r["kind"] for r in report["removed"]} >= {"bundle", "snapshot"}
    assert g.entries("bundles") == {} and g.entries("snapshots") == {}
    assert g.entries("tmp") == {}


def test_a_gc_that_stopped_halfway_wedges_no_one(group_cache: GroupCache) -> None:
    """What the old gc left: B's dead scratch dir `tmp/gc-<host>-<pid>-<hex>` (0700, owner file
    beside it) holding A's half-removed tree. No command of A, B or root may fail on it, and
    root's gc removes it."""
    g = group_cache
    bundle = Path(g.run(g.a, "bundle", image(g)).stdout.strip().splitlines()[-1])
    child = subprocess.Popen(["true"])
    child.wait()
    scratch = g.cache / "tmp" / f"gc-{socket.gethostname()}-{child.pid}-0123456789ab"
    scratch.mkdir(mode=0o700)
    os.chown(scratch, g.b.uid, g.gid)
    owner = Path(f"{scratch}.owner")
    owner.write_text(Owner(socket.gethostname(), child.pid, None).to_json())
    os.chown(owner, g.b.uid, g.gid)
    os.rename(bundle, scratch / bundle.name)
    for who in (g.a, g.b):
        g.run(who, "bundle", image(g))
        g.run(who, "cache", "ls")
    assert {(item["name"], item["owner_uid"]) for item in g.gc(g.b)["left"]} == {
        (str(scratch), g.b.uid)}  # reported, not fatal
    assert {(item["name"], item["owner_uid"]) for item in g.gc(g.a)["left"]} == {
        (str(scratch), g.b.uid)}  # B's, not A's to remove
    assert scratch.exists()
    g.run(None, "bundle", image(g))  # root's next command removes it
    assert not scratch.exists() and not owner.exists()
    assert g.gc(None)["left"] == []


def test_a_members_verify_reports_roots_private_bundle_and_goes_on(
        group_cache: GroupCache) -> None:
    """Root's `--no-rootless` bundle in the cache is 0700: a member cannot read it, nor move
    it. Their `cache verify` used to abort (`cannot quarantine ...: Permission denied`); now
    it says it cannot check it and goes on."""
    g = group_cache
    g.run(None, "bundle", "--no-rootless", image(g))
    private = [n for n, uid in g.entries("bundles").items() if uid == 0]
    assert private
    done = g.run(g.b, "cache", "verify", "--json")
    report = json.loads(done.stdout)
    assert report["problems"] == [] and report["ok"]
    assert {(u["kind"], u["name"], u["owner_uid"]) for u in report["unchecked"]} >= {
        ("bundle", private[0], 0)}
    assert g.entries("quarantine") == {}
    assert private[0] in g.entries("bundles")


def test_a_snapshot_only_its_maker_reads_is_not_quarantined_by_another_member(
        group_cache: GroupCache) -> None:
    """An image with 0700 directories gives a snapshot whose inner directories only its maker
    can read. Another member's verify and bundle used to call its files removed, quarantine
    it, rebuild it, and have it quarantined again by the first. What a member cannot read is
    "cannot check", never "changed"."""
    g = group_cache
    g.run(g.a, "bundle", image(g))
    snapshots = {n: uid for n, uid in g.entries("snapshots").items() if not n.startswith(".")}
    assert snapshots and set(snapshots.values()) == {g.a.uid}
    # B's bundle outside the cache is made from the image's snapshot: B gets a tree of its own
    linked = g.b.home / "linked"
    done = g.run(g.b, "bundle", "--link", image(g), str(linked))
    assert "changed" not in done.stderr
    assert (linked / "rootfs" / "root" / ".profile").read_bytes() == b"PATH=/sbin\n"
    assert g.entries("quarantine") == {}
    assert g.entries("snapshots") == snapshots
    report = json.loads(g.run(g.b, "cache", "verify", "--json").stdout)
    assert report["problems"] == [] and report["ok"]
    assert {u["kind"] for u in report["unchecked"]} == {"snapshot"}
    assert {u["owner_uid"] for u in report["unchecked"]} == {g.a.uid}
    text = g.run(g.b, "cache", "verify").stdout
    assert "cannot check snapshot sha256:" in text
    assert f"of {g.a.name} (uid {g.a.uid})" in text
    assert g.entries("quarantine") == {} and g.entries("snapshots") == snapshots
    report = json.loads(g.run(g.a, "cache", "verify", "--json").stdout)
    assert report["problems"] == [] and report["unchecked"] == []
    g.run(g.a, "bundle", "--link", image(g), str(g.a.home / "linked"))
    assert g.entries("quarantine") == {} and g.entries("snapshots") == snapshots


def test_a_broken_bundle_a_member_cannot_move_is_reported_and_verify_goes_on(
        group_cache: GroupCache) -> None:
    """A broken bundle of A's that B may not move to quarantine/ (its directory is not
    group-writable, as a umask 022 makes it): B's verify reports it as left in place and
    checks everything else, instead of aborting on `cannot quarantine`."""
    g = group_cache
    bundle = Path(g.run(g.a, "bundle", image(g)).stdout.strip().splitlines()[-1])
    (bundle / "config.json").unlink()
    bundle.chmod(0o2755)
    done = g.run(g.b, "cache", "verify", "--json", expect=1)
    report = json.loads(done.stdout)
    assert [(p["kind"], p["name"]) for p in report["problems"]] == [
        ("broken-bundle", bundle.name)]
    assert report["problems"][0]["action"].startswith("left in place (cannot quarantine")
    assert report["snapshots"] == 1 and report["blobs"] > 0
    assert "cache verify found 1 problem" in done.stderr
    assert bundle.exists() and g.entries("quarantine") == {}
    g.run(g.a, "cache", "verify", expect=1)  # its owner can
    assert not bundle.exists() and len(g.entries("quarantine")) == 1
