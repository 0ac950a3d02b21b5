"""When cached content was last used, recorded cheaply and safely on shared filesystems.

Each entry has one empty file ``CACHE/used/<kind>-<key>`` whose mtime is the time of its last
use (pull, bundle, stage). Recording a use is ``open(O_CREAT)`` plus ``utime()``: no read, no
rewrite, no lock, so any number of nodes may record uses of the same entry at once, and the
last writer wins (which is what "last use" means). Kinds and keys:

    image-<sha256 hex of the manifest>   an image (every ref pointing at that manifest)
    bundle-<bundle key>                  a bundle under CACHE/bundles/<key>
    squashfs-<image key>                 an ocistage-pyxis-importer image, CACHE/pyxis/<key>.sqsh

Recording is best effort: a cache on a read-only mount or a full disk must not fail a pull
because its last use could not be written down.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Literal

UsageKind = Literal["image", "bundle", "squashfs"]
KINDS = ("image", "bundle", "squashfs")
USED_DIR = "used"
_KEY_RE = re.compile(r"^[0-9a-f]{16,128}$")


def usage_path(cache_root: Path, kind: UsageKind, key: str) -> Path:
    if not _KEY_RE.match(key):
        raise ValueError(f"invalid usage key {key!r}")
    return cache_root / USED_DIR / f"{kind}-{key}"


def touch(cache_root: Path, kind: UsageKind, key: str) -> bool:
    """Record that ``kind``/``key`` was used now; False if that could not be written."""
    path = usage_path(cache_root, kind, key)
    try:
        path.parent.mkdir(exist_ok=True)
        # O_NONBLOCK: a FIFO a member planted fails (ENXIO) instead of waiting for a reader
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o644)
        try:
            os.utime(fd)
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def last_used(cache_root: Path, kind: UsageKind, key: str) -> float | None:
    """The time of the last recorded use, or None if none was recorded."""
    try:
        return usage_path(cache_root, kind, key).stat().st_mtime
    except OSError:
        return None


def all_usage(cache_root: Path) -> dict[tuple[str, str], float]:
    """Every recorded use: ``(kind, key) -> time``."""
    result: dict[tuple[str, str], float] = {}
    with contextlib.suppress(FileNotFoundError), os.scandir(cache_root / USED_DIR) as entries:
        for entry in entries:
            kind, sep, key = entry.name.partition("-")
            if not sep or kind not in KINDS or not _KEY_RE.match(key):
                continue
            with contextlib.suppress(OSError):
                result[(kind, key)] = entry.stat(follow_symlinks=False).st_mtime
    return result


def forget(cache_root: Path, kind: UsageKind, key: str) -> None:
    """Drop the record of ``kind``/``key`` (its entry was removed)."""
    with contextlib.suppress(FileNotFoundError):
        usage_path(cache_root, kind, key).unlink()
