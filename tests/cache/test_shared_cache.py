"""A group-shared cache with a hostile member: a second uid (``setpriv``, nobody) who can write
``ingest/`` and ``blobs/`` plants a symlink as a partial download, a file of its own there, or
replaces a stored config. None of it may be written through, published or used."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.bundler.bundle import make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.pull import pull
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.cache import leases
from ocistage.cache.digest import Digest
from ocistage.cache.errors import IntegrityError
from ocistage.cache.leases import Holder
from ocistage.cache.locks import owner_is_dead
from ocistage.cache.store import Store
from tests.bundler.tarbuilder import build_tar, file, write_oci_layout
from tests.deadline import deadline

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
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as a second user")
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
