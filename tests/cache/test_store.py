"""The store: verified publish, resume after crash, one writer per blob, scratch cleanup."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ocistage.cache.atomicwrite import _temp_tag
from ocistage.cache.digest import Digest
from ocistage.cache.errors import StoreError, UntrustedPath
from ocistage.cache.store import Store
from ocistage.errors import IntegrityError


def digest_of(data: bytes) -> Digest:
    return Digest("sha256", hashlib.sha256(data).hexdigest())


def test_open_creates_an_oci_layout(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "c")
    assert json.loads((tmp_path / "c/oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((tmp_path / "c/index.json").read_text())
    assert index["schemaVersion"] == 2 and index["manifests"] == []
    assert store.read_index() == []


@pytest.mark.parametrize("depth", [
    # a user's own loose cache root is made private instead (tests/cache/test_private_cache.py)
    pytest.param(0, id="root", marks=pytest.mark.needs_root("root keeps its cache's mode")),
    pytest.param(1, id="blobs")])
def test_nothing_is_made_in_a_cache_directory_others_can_write(tmp_path: Path,
                                                              depth: int) -> None:
    """A cache root (or its blobs/) that another user could write is refused before ocistage
    makes anything in it: the check comes before each mkdir of a child."""
    root = tmp_path / "cache"
    root.mkdir()
    hostile = root if depth == 0 else root / "blobs"
    hostile.mkdir(exist_ok=True)
    hostile.chmod(0o777)  # world-writable without the sticky bit
    before = sorted(p.name for p in hostile.iterdir())
    with pytest.raises(UntrustedPath):
        Store.open(root)
    assert sorted(p.name for p in hostile.iterdir()) == before


def test_ingest_publishes_only_verified_content(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    data = os.urandom(3 << 20)
    digest = digest_of(data)
    with store.ingest(digest, len(data)) as ingest:
        assert ingest is not None and ingest.offset == 0
        ingest.write(data[:100])
        assert not store.has_blob(digest)
        ingest.write(data[100:])
        path = ingest.commit()
    assert path == store.blob_path(digest) and path.read_bytes() == data
    assert oct(path.stat().st_mode & 0o777) == "0o444"
    assert not list((tmp_path / "ingest").iterdir())
    with store.ingest(digest, len(data)) as again:
        assert again is None


def test_corrupt_content_is_never_published(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    data = b"hello world" * 1000
    digest = digest_of(data)
    with store.ingest(digest, len(data)) as ingest:
        assert ingest is not None
        ingest.write(data[:-1] + b"X")
        with pytest.raises(IntegrityError, match="has digest"):
            ingest.commit()
    assert not store.has_blob(digest)
    # the corrupt bytes are not kept for a later resume either
    with store.ingest(digest, len(data)) as ingest:
        assert ingest is not None and ingest.offset == 0


def test_size_is_enforced_while_streaming(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    data = b"abc"
    with store.ingest(digest_of(data), 2) as ingest:
        assert ingest is not None
        with pytest.raises(IntegrityError, match="larger than its declared size"):
            ingest.write(data)
    with store.ingest(digest_of(data), 4) as ingest:
        assert ingest is not None
        ingest.write(data)
        with pytest.raises(IntegrityError, match="3 bytes, expected 4"):
            ingest.commit()


def test_interrupted_ingest_resumes_where_it_stopped(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    data = os.urandom(1 << 20)
    digest = digest_of(data)
    with pytest.raises(ConnectionError), store.ingest(digest, len(data)) as ingest:
        assert ingest is not None
        ingest.write(data[:1000])
        raise ConnectionError("dropped")
    with store.ingest(digest, len(data)) as ingest:
        assert ingest is not None and ingest.offset == 1000
        ingest.write(data[1000:])
        ingest.commit()
    assert store.blob_path(digest).read_bytes() == data


def test_restart_discards_partial_content(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    data = b"0123456789"
    with store.ingest(digest_of(data), len(data)) as ingest:
        assert ingest is not None
        ingest.write(b"garbage")
        ingest.restart()
        assert ingest.offset == 0
        ingest.write(data)
        ingest.commit()


def test_put_blob_verifies(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    data = b'{"a": 1}'
    assert store.put_blob(data) == digest_of(data)
    assert store.read_blob(digest_of(data)) == data
    with pytest.raises(IntegrityError):
        store.put_blob(b"other", digest_of(data))


def test_tag_replaces_same_name_and_platform(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    amd = {"os": "linux", "architecture": "amd64"}
    arm = {"os": "linux", "architecture": "arm64"}
    for n, platform in ((1, amd), (2, arm), (3, amd)):
        store.tag("r/x:1", {"mediaType": "m", "digest": f"sha256:{n:064x}", "size": n,
                            "platform": platform})
    entries = store.lookup("r/x:1")
    assert sorted(e["size"] for e in entries) == [2, 3]


def test_read_missing_blob_is_a_store_error(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    with pytest.raises(StoreError, match="not in the cache"):
        store.open_blob(digest_of(b"nope"))


def test_scratch_of_dead_owner_is_removed_on_open(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    mine = store.temp_dir()
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            from ocistage.cache.store import Store
            print(Store.open({str(tmp_path)!r}).temp_dir())
        """)], check=True, capture_output=True, text=True)
    theirs = Path(child.stdout.strip())
    assert theirs.is_dir()
    removed = Store(tmp_path).clean_leftovers()
    assert removed == [theirs] and not theirs.exists()
    assert mine.is_dir()  # ours is alive


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from ocistage.cache.digest import Digest
    from ocistage.cache.store import Store
    root, hexd, size, path, slow = sys.argv[1:6]
    store = Store.open(root)
    data = Path(path).read_bytes()
    with store.ingest(Digest("sha256", hexd), int(size)) as ingest:
        if ingest is None:
            print("reused"); sys.exit(0)
        start = ingest.offset
        for i in range(start, len(data), 65536):
            ingest.write(data[i:i + 65536])
            if slow == "1":
                time.sleep(0.01)
        ingest.commit()
        print(f"wrote-from-{start}")
""")


def run_writer(root: Path, data_file: Path, digest: Digest, size: int,
               slow: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), digest.hex, str(size), str(data_file),
         "1" if slow else "0"], stdout=subprocess.PIPE, text=True)


def test_kill_9_during_ingest_then_rerun_resumes(tmp_path: Path) -> None:
    data = os.urandom(8 << 20)
    data_file = tmp_path / "data"
    data_file.write_bytes(data)
    digest = digest_of(data)
    root = tmp_path / "cache"
    Store.open(root)
    victim = run_writer(root, data_file, digest, len(data), slow=True)
    partial = root / "ingest" / f"{digest.hex}.partial"
    deadline = time.monotonic() + 30
    while not (partial.exists() and partial.stat().st_size > (1 << 20)):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not Store(root).has_blob(digest)
    survivor = run_writer(root, data_file, digest, len(data))
    out, _ = survivor.communicate(timeout=60)
    assert survivor.returncode == 0
    resumed_at = int(out.strip().removeprefix("wrote-from-"))
    assert resumed_at >= 1 << 20  # the dead writer's verified-again bytes were reused
    assert Store(root).blob_path(digest).read_bytes() == data


def _ingest_in_process(args: tuple[str, str, int, str]) -> str:
    root, hexd, size, path = args
    out = subprocess.run([sys.executable, "-c", WRITER, root, hexd, str(size), path, "1"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_eight_concurrent_writers_write_once(tmp_path: Path) -> None:
    data = os.urandom(2 << 20)
    data_file = tmp_path / "data"
    data_file.write_bytes(data)
    digest = digest_of(data)
    root = tmp_path / "cache"
    Store.open(root)
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        results = pool.map(_ingest_in_process,
                           [(str(root), digest.hex, len(data), str(data_file))] * 8)
    assert sorted(results).count("reused") == 7, results
    assert Store(root).blob_path(digest).read_bytes() == data


def test_dead_owner_lock_is_removed_and_live_one_kept(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    dead = tmp_path / "ingest" / f"{'d' * 64}.lock"
    subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        from ocistage.cache.locks import FileLock
        FileLock(Path({str(dead)!r})).try_acquire()  # exits without releasing
    """)], check=True)
    assert dead.exists()
    from ocistage.cache.locks import FileLock
    live = FileLock(tmp_path / "ingest" / f"{'e' * 64}.lock")
    assert live.try_acquire()
    old = time.time() - 3600
    os.utime(live.path, (old, old))  # a late heartbeat must not make a live owner look dead
    try:
        assert store.clean_leftovers() == [dead]
        assert live.held()
    finally:
        live.release()


def test_temp_files_of_dead_writers_are_removed(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    script = textwrap.dedent(f"""
        import os
        from pathlib import Path
        import ocistage.cache.atomicwrite as atomicwrite
        # die between writing the temp file and renaming it
        atomicwrite.os.rename = lambda *a: os._exit(9)
        atomicwrite.write_file_atomic(Path({str(tmp_path / "leases" / "x.json")!r}), b"{{}}")
    """)
    (tmp_path / "leases").mkdir()
    subprocess.run([sys.executable, "-c", script], check=False)
    leftovers = [p for p in (tmp_path / "leases").iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1
    mine = tmp_path / f".index.json.{_temp_tag()}-{os.getpid()}-x.tmp"
    mine.write_text("in progress")
    other_host = tmp_path / ".index.json.ocistage@elsewhere-1-x.tmp"
    other_host.write_text("in progress elsewhere")
    assert store.clean_leftovers() == leftovers
    assert mine.exists() and other_host.exists()
