"""The squashfs images of ``ocistage-pyxis-importer`` in a store, as ``cache ls|du|gc`` see them.

The importer (``ocistage.bundler.pyxis``) publishes each image as
``STORE/pyxis/<key>.sqsh`` with its record ``<key>.json`` beside it (source, manifest, ...),
builds it under ``<key>.lock``, notes what references resolved to in ``pyxis/refs/`` and records
each use in ``STORE/used/squashfs-<key>`` (:mod:`ocistage.cache.usage`). A job holds an image
with a lease ``squashfs:<key>``; ``cache gc`` evicts images like refs and bundles (least
recently used first, or last used longer ago than ``--older-than``), never one a live lease
names. The layout lives here, below the importer, so that GC knows it.

Users who only read a store (a site's, docs/site.md) leave no lease there. In such a store GC
*retires* an image before it removes it: a marker ``pyxis/retired/<key>`` (the store owner's,
in a directory only the owner writes) from which on no get hands the image out, and the image
is removed by a GC at least :data:`RETIRE_GRACE` later, once every get that handed it out
before has had its job open it (a mounted or extracted squashfs needs no name).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache import usage
from ocistage.cache.errors import ForeignFile
from ocistage.cache.jsondoc import parse_json, read_document
from ocistage.cache.locks import owner_is_dead

IMAGE_DIR = "pyxis"
IMAGE_SUFFIX = ".sqsh"
RECORD_SUFFIX = ".json"
LOCK_SUFFIX = ".lock"
REFS_DIR = "refs"
RETIRED_DIR = "retired"
#: how long a retired image stays at its path: far longer than pyxis takes from a get to
#: opening the image it printed (squashfuse or ``enroot create``, seconds)
RETIRE_GRACE = 3600.0
KEY_RE = re.compile(r"[0-9a-f]{64}")
MAX_RECORD_BYTES = 64 << 10


def images_dir(root: Path) -> Path:
    return root / IMAGE_DIR


def image_path_at(root: Path, key: str) -> Path:
    return images_dir(root) / f"{key}{IMAGE_SUFFIX}"


def record_path_at(root: Path, key: str) -> Path:
    return images_dir(root) / f"{key}{RECORD_SUFFIX}"


def retired_path_at(root: Path, key: str) -> Path:
    return images_dir(root) / RETIRED_DIR / key


def retired_since(root: Path, key: str) -> float | None:
    """When image ``key`` was retired (its marker's mtime); None if it is not (no marker, or
    something else than a regular file at its name: nothing GC judges)."""
    try:
        st = os.lstat(retired_path_at(root, key))
    except OSError:
        return None
    return st.st_mtime if stat.S_ISREG(st.st_mode) else None


def retire(root: Path, key: str) -> None:
    """Mark image ``key`` retired now: no get hands it out from here on (GC, see above)."""
    directory = images_dir(root) / RETIRED_DIR
    directory.mkdir(mode=0o755, exist_ok=True)
    fd = os.open(directory / key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                 | os.O_NONBLOCK, 0o644)
    os.close(fd)


def unretire(root: Path, key: str) -> None:
    """Drop image ``key``'s retirement (a get of the store's owner uses it again: it holds a
    lease on it from now on). Best effort: where the caller may not (a group member in a
    store root's gc retired in), the image stays retired, and leased."""
    with contextlib.suppress(OSError):
        retired_path_at(root, key).unlink()


def is_image(path: Path) -> bool:
    """Whether an image is at ``path``: a regular file, never a symlink (nothing planted)."""
    try:
        return os.path.isfile(path) and not os.path.islink(path)
    except OSError:
        return False


def squashfs_target(key: str) -> str:
    """The lease target of image ``key``."""
    return f"squashfs:{key}"


def touch(root: Path, key: str) -> bool:
    """Record a use of image ``key`` now (best effort, as every last-use record)."""
    return usage.touch(root, "squashfs", key)


@dataclass(frozen=True)
class SquashfsImage:
    key: str
    path: Path
    record: Path
    source: str | None   # the reference it was made from (its record), if readable
    size: int            # bytes of the image on disk
    last_used: float     # its last recorded use, else when it was published
    retired: float | None = None   # when GC retired it (users who only read a store)

    @property
    def target(self) -> str:
        return squashfs_target(self.key)


def list_images(root: Path) -> list[SquashfsImage]:
    """The published images of the store at ``root`` (regular files named by a key; a
    symlink or anything else planted there is not an image), by key."""
    uses = usage.all_usage(root)
    found = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), \
            os.scandir(images_dir(root)) as entries:
        for entry in entries:
            key = entry.name.removesuffix(IMAGE_SUFFIX)
            if key == entry.name or not KEY_RE.fullmatch(key):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    continue
                record = record_path_at(root, key)
                found.append(SquashfsImage(
                    key, Path(entry.path), record, _field(record, "source"),
                    st.st_blocks * 512, uses.get(("squashfs", key), st.st_mtime),
                    retired_since(root, key)))
    return sorted(found, key=lambda image: image.key)


def stray_records(root: Path, listed: set[str], kept: set[str]) -> list[Path]:
    """What GC drops besides the images: records of no image in ``listed`` (the images there
    were: a publish cut between its two renames, or an image removed by hand; an evicted
    image's record goes with it), retirement markers of no such image, and reference notes of
    ``pyxis/refs/`` naming an image not in ``kept``."""
    stray = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), \
            os.scandir(images_dir(root)) as entries:
        for entry in entries:
            key = entry.name.removesuffix(RECORD_SUFFIX)
            if key != entry.name and KEY_RE.fullmatch(key) and key not in listed:
                stray.append(Path(entry.path))
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), \
            os.scandir(images_dir(root) / RETIRED_DIR) as markers:
        stray += [Path(entry.path) for entry in markers
                  if KEY_RE.fullmatch(entry.name) and entry.name not in listed]
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), \
            os.scandir(images_dir(root) / REFS_DIR) as notes:
        for entry in notes:
            if not entry.name.endswith(RECORD_SUFFIX):
                continue
            noted = _field(Path(entry.path), "key")
            if noted is not None and noted not in kept:
                stray.append(Path(entry.path))
    return sorted(stray)


def _field(document: Path, name: str) -> str | None:
    """The string ``name`` of a JSON record of ours (None: absent, unreadable, planted by
    someone else, or no such string: nothing GC judges)."""
    try:
        data = parse_json(read_document(document, MAX_RECORD_BYTES, owners="group").decode())
    except (OSError, ValueError, UnicodeDecodeError, ForeignFile):
        return None
    value = data.get(name) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def dead_build_locks(root: Path) -> list[Path]:
    """The build locks (``<key>.lock``) whose owner is known to be gone: a killed build."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), \
            os.scandir(images_dir(root)) as entries:
        return sorted(Path(entry.path) for entry in entries
                      if entry.name.endswith(LOCK_SUFFIX)
                      and KEY_RE.fullmatch(entry.name.removesuffix(LOCK_SUFFIX))
                      and owner_is_dead(Path(entry.path)))
    return []
