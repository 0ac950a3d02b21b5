"""Unpacked layer snapshots: the rootfs after layers 1..n, stored by ChainID.

A snapshot is the tree that applying an image's first ``n`` layers gives. It is keyed by the
image-spec *ChainID* of those layers (``ChainID(L1) = DiffID(L1)``,
``ChainID(L1..Ln) = sha256(ChainID(L1..Ln-1) + " " + DiffID(Ln))``), so two images that share
their base layers share the snapshot of that base, whatever their manifests say. For a
one-layer image the ChainID *is* the layer's diff_id. Layout::

    snapshots/<hex>/rootfs/          the tree, read-only by convention (nothing writes into it)
    snapshots/<hex>/snapshot.json    chain id, diff_ids, entry count, host and boot that made it

Invariants:

- a path under ``snapshots/`` exists only once every layer in it was applied and its diff_id
  verified, and each layer blob was verified against its digest: snapshots are built in a
  scratch dir of the store and published by ``rename()``;
- nothing ever writes into a published snapshot's files. Bundles and newer snapshots are made
  from it with hard links, and the layer applier never opens an existing file for writing (it
  replaces entries, it does not modify them), so applying layers on a linked clone leaves the
  original untouched;
- a snapshot is not fsync-ed file by file (that would cost more than extracting it). It is
  trusted if it was made on another host (its writer closed every file, which flushes them on
  NFS), on this host in the current boot (the page cache is authoritative), or after an explicit
  sync. After a reboot of the host that made it, an unsynced snapshot is thrown away and rebuilt
  from the verified blobs: a power loss can never leave half-written files in use.

``cache gc`` lists snapshots with :func:`list_snapshots` and removes them with
:func:`remove_snapshot`; leases on ``snapshot:sha256:<hex>`` (the ChainID) protect one while a
command builds from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cache.digest import Digest
from cache.errors import OcistageError, StoreError
from cache.store import Store, _translate_oserror, fsync_dir, remove_tree

SNAPSHOTS = "snapshots"
METADATA = "snapshot.json"
SNAPSHOT_FORMAT = 1


def chain_ids(diff_ids: Sequence[Digest]) -> list[Digest]:
    """The ChainID of every prefix of ``diff_ids`` (image-spec ``config.md``)."""
    chain: list[Digest] = []
    for diff_id in diff_ids:
        if not chain:
            chain.append(diff_id)
            continue
        text = f"{chain[-1]} {diff_id}".encode()
        chain.append(Digest("sha256", hashlib.sha256(text).hexdigest()))
    return chain


def lease_target(chain_id: Digest) -> str:
    return f"snapshot:{chain_id}"


@dataclass(frozen=True)
class SnapshotInfo:
    """One published snapshot as ``cache ls``/``gc`` see it."""

    chain_id: Digest
    path: Path                 # snapshots/<hex> (the rootfs is path / "rootfs")
    diff_ids: tuple[Digest, ...]
    entries: int
    created: float            # seconds since the epoch
    last_used: float          # mtime of snapshot.json, touched whenever a bundle uses it

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"


def snapshot_dir(store: Store, chain_id: Digest) -> Path:
    return store.root / SNAPSHOTS / chain_id.hex


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _trusted(metadata: dict[str, object]) -> bool:
    """See the module docstring: unsynced snapshots of this host do not survive its reboot."""
    if metadata.get("synced") is True:
        return True
    if metadata.get("host") != os.uname().nodename:
        return True
    return metadata.get("boot_id") == _boot_id()


def _read_metadata(directory: Path) -> dict[str, object] | None:
    try:
        data = json.loads((directory / METADATA).read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def find_snapshot(store: Store, chain_id: Digest) -> Path | None:
    """The rootfs of the published snapshot ``chain_id``, or ``None``.

    A snapshot that cannot be trusted any more (made before a reboot of this host, never
    synced) is removed here, so the caller rebuilds it.
    """
    directory = snapshot_dir(store, chain_id)
    metadata = _read_metadata(directory)
    if metadata is None:
        return None
    if not _trusted(metadata):
        remove_snapshot(store, chain_id)
        return None
    with contextlib.suppress(OSError):
        os.utime(directory / METADATA)  # last use, for gc's age-based policies
    return directory / "rootfs"


def publish_snapshot(store: Store, scratch: Path, chain_id: Digest,
                     diff_ids: Sequence[Digest], entries: int) -> Path:
    """Publish ``scratch`` (holding ``rootfs/``) as snapshot ``chain_id``; return its rootfs.

    If another process published the same snapshot first, ``scratch`` is removed and theirs
    is used: both were built from the same verified layers.
    """
    final = snapshot_dir(store, chain_id)
    metadata = {"format": SNAPSHOT_FORMAT, "chain_id": str(chain_id),
                "diff_ids": [str(d) for d in diff_ids], "entries": entries,
                "created": time.time(), "host": os.uname().nodename, "boot_id": _boot_id(),
                "synced": False}
    try:
        (scratch / METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
        final.parent.mkdir(exist_ok=True)
        try:
            os.rename(scratch, final)
        except OSError:
            if _read_metadata(final) is None:
                raise
            remove_tree(scratch)
            return final / "rootfs"
        fsync_dir(final.parent)
    except OSError as exc:
        raise _translate_oserror(exc, f"publishing snapshot {chain_id.short}") from exc
    return final / "rootfs"


def list_snapshots(store: Store) -> list[SnapshotInfo]:
    """Every published snapshot (unreadable or half-removed entries are skipped)."""
    root = store.root / SNAPSHOTS
    found: list[SnapshotInfo] = []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    for name in names:
        directory = root / name
        metadata = _read_metadata(directory)
        if metadata is None:
            continue
        raw_ids = metadata.get("diff_ids")
        try:
            chain_id = Digest.parse(str(metadata.get("chain_id")))
            diff_ids = tuple(Digest.parse(str(d))
                             for d in (raw_ids if isinstance(raw_ids, list) else []))
            last_used = (directory / METADATA).stat().st_mtime
        except (OSError, OcistageError):
            continue  # half-removed or hand-edited: skipped, never fatal
        if chain_id.hex != name:
            continue
        entries = metadata.get("entries", 0)
        created = metadata.get("created", 0.0)
        found.append(SnapshotInfo(chain_id, directory, diff_ids,
                                  entries if isinstance(entries, int) else 0,
                                  float(created) if isinstance(created, int | float) else 0.0,
                                  last_used))
    return found


def remove_snapshot(store: Store, chain_id: Digest) -> None:
    """Unpublish snapshot ``chain_id`` (one rename) and delete its tree; no error if absent.

    Bundles made from it by hard links keep their files: only the snapshot's names go.
    """
    final = snapshot_dir(store, chain_id)
    doomed = store.tmp_dir / f"snapshot-rm-{chain_id.hex[:16]}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(final, doomed)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _translate_oserror(exc, f"removing snapshot {chain_id.short}") from exc
    try:
        remove_tree(doomed)
    except OSError as exc:
        raise _translate_oserror(exc, f"removing snapshot {chain_id.short}") from exc


def link_tree(source: Path, dest: Path) -> None:
    """Make ``dest`` (absent) a copy of the trusted tree ``source``, hard-linking its files.

    Directories are new (with the source's modes and times); every other entry is a hard link
    to the source's inode. Used on snapshots, which are built by ocistage and never contain
    anything but directories, regular files, symlinks and FIFOs. GNU ``cp -al`` does this in
    C (``-P``: symlinks are never followed), about twice as fast as a Python walk (measured).
    """
    _cp(["-al"], source, dest)


def copy_tree(source: Path, dest: Path) -> None:
    """Make ``dest`` (absent) an independent copy of ``source`` (reflinks where supported)."""
    _cp(["-a", "--reflink=auto"], source, dest)


def _cp(flags: list[str], source: Path, dest: Path) -> None:
    cp = shutil.which("cp") or "/bin/cp"
    result = subprocess.run([cp, *flags, "--no-target-directory", "--", str(source), str(dest)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, check=False)
    if result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip().splitlines()
        raise StoreError(f"cannot copy {source} to {dest}: "
                         f"{message[-1] if message else 'cp failed'}")
