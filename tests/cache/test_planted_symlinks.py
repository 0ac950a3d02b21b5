"""A member of a group-shared cache (docs/trust.md) plants symlinks where ocistage keeps its
small files: every reader refuses them (O_NOFOLLOW) instead of reading the file they point at,
and every writer of a new file refuses to write through one (O_EXCL). Each planted link points
at a file whose content would be accepted, so following it would show."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from ocistage.cache.bundleinfo import BUNDLE_INFO, read_bundle_info
from ocistage.cache.digest import Digest
from ocistage.cache.fdio import write_new_file
from ocistage.cache.leases import Holder, Lease, acquire, all_leases
from ocistage.cache.locks import Owner, lock_owner, owner_is_dead
from ocistage.cache.snapshots import METADATA, find_snapshot, snapshot_dir
from ocistage.cache.store import Store
from ocistage.cache.verify import verify
from ocistage.errors import IntegrityError


def _plant(link: Path, target: Path, content: str | bytes) -> None:
    """``target`` holds ``content``; ``link`` (a name ocistage reads) points at it."""
    target.write_bytes(content.encode() if isinstance(content, str) else content)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def test_a_planted_lease_is_not_read(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    real = acquire(cache, "bundle:aa", Holder.this_process())
    forged = Lease(id="forged", target="bundle:bb", holder=Holder.pin("evil"),
                   created=time.time())
    _plant(cache / "leases" / "forged.json", tmp_path / "elsewhere.json", forged.to_json())
    assert [lease.id for lease in all_leases(cache)] == [real.id]


def test_a_planted_lease_nested_too_deeply_is_skipped(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "leases").mkdir(parents=True)
    (cache / "leases" / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    assert all_leases(cache) == []


def test_a_lock_file_that_is_a_symlink_has_no_owner_and_is_not_taken_for_dead(
        tmp_path: Path) -> None:
    dead = Owner(os.uname().nodename, 2 ** 22 + 12345, None)  # no such pid: dead if read
    lock = tmp_path / "cache" / "locks" / "x.lock"
    _plant(lock, tmp_path / "owner.json", json.dumps(dead.__dict__) + "\n")
    assert lock_owner(lock) is None
    assert owner_is_dead(lock) is False  # not ours to judge: the lock is not removed


def test_a_planted_snapshot_metadata_is_not_trusted(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    chain = Digest("sha256", "ab" * 32)
    directory = snapshot_dir(store, chain)
    (directory / "rootfs").mkdir(parents=True)
    metadata = {"format": 1, "chain_id": str(chain), "host": "elsewhere", "synced": True}
    _plant(directory / METADATA, tmp_path / "meta.json", json.dumps(metadata))
    assert find_snapshot(store, chain) is None


def test_a_planted_bundle_info_is_not_read(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    info = {"manifest": str(Digest("sha256", "cd" * 32)), "image": "evil/image"}
    _plant(bundle / BUNDLE_INFO, tmp_path / "info.json", json.dumps(info))
    assert read_bundle_info(bundle) == (None, None)


def test_a_blob_replaced_by_a_symlink_to_its_own_content_is_foreign(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    data = b"layer bytes"
    digest = store.put_blob(data)
    path = store.blob_path(digest)
    path.unlink()
    _plant(path, tmp_path / "same-content", data)  # right bytes, but not a file of the cache
    assert Digest.of_bytes(data) == digest
    report = verify(store, dry_run=True)
    assert [p.kind for p in report.problems] == ["foreign-file"]
    assert not store.has_blob(digest)
    with pytest.raises(IntegrityError, match="symbolic link"):  # never opened as the blob
        store.open_blob(digest)
    assert (tmp_path / "same-content").read_bytes() == data


def test_a_new_file_is_never_written_through_a_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    _plant(tmp_path / "scratch" / METADATA, victim, b"keep")
    with pytest.raises(OSError) as refused:
        write_new_file(tmp_path / "scratch" / METADATA, b"overwritten")
    assert refused.value.errno == errno.EEXIST
    assert victim.read_bytes() == b"keep"
