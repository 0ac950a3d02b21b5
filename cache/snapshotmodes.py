"""Snapshot files keep their owner's read bit; ``snapshot.modes`` records the image's own mode.

An image may hold regular files its owner may not read (a ``000`` ``/etc/shadow``, a ``0200``
file). Root reads them anyway; the user who owns a rootless snapshot cannot, so a writable
bundle copied from the snapshot (``cp -a``), a staged copy or a squashfs image of a linked
bundle would fail on them (issue 34). And a snapshot is shared by every command that builds
from it at once: making such a file readable for the time of a copy would be a race.

So, before a snapshot is published, :func:`keep_owner_readable` walks its still private tree,
gives every regular file that lacks it the owner's read bit (``u+r``, once, for good) and
returns the image's own mode of each such path, which :func:`write_modes` keeps in
``snapshots/<hex>/snapshot.modes``. What shares the snapshot's inodes (cached bundles,
``bundle --link``, trees staged from them) shows ``u+r`` there, as a rootless directory shows
``u+rwx`` (docs/layers.md); a private copy (``bundle REF DEST``) gets the image's modes back
from the record (:func:`restore_modes`), exactly.

A snapshot built on a lower one inherits the lower one's record for the inodes it links to
(under any name: a later layer may hard-link them anew). A snapshot without a record was made
by an older ocistage and holds the image's modes as they are: one built on it gets none either,
and its copies need nothing restored.

The record: a header line, then per file ``relative path NUL mode NUL`` (mode in octal), in
the order of the walk.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from ocistage.cache.dirfds import DIR_PATH, Identity, chmod_path_fd, identity, open_parent
from ocistage.cache.errors import StoreError, translate_oserror
from ocistage.cache.treewalk import walk_dir_fds

MODES = "snapshot.modes"
HEADER = b"ocistage snapshot modes 1\n"
MAX_RECORD_BYTES = 64 << 20
_FILE_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

#: a path of the rootfs and the image's mode of the file there
Mode = tuple[str, int]


def keep_owner_readable(rootfs: Path, base: Path | None = None, *, unreadable: bool = True,
                        links: bool = True) -> list[Mode] | None:
    """Give every regular file of the private scratch tree ``rootfs`` that its owner may not
    read ``u+r``; return the image's mode of every path whose file differs from it now
    (inherited from ``base``, the rootfs of the snapshot it was cloned from, for the inodes
    linked to it). None when ``base`` has no record: nothing is changed then.

    The tree is walked (an ``lstat`` per entry, about what an unpack's ``snapshot.files``
    costs) only where it may hold such files: what was applied onto ``rootfs`` made a file
    without ``u+r`` (``unreadable``), or made hard links (``links``) while ``base`` has
    recorded files, which a link may have given another name. Otherwise the record of
    ``base`` holds for each of its paths that still names the same inode."""
    real: dict[Identity, int] = {}
    recorded: list[Mode] = []
    if base is not None:
        found_base = read_modes(base.parent)
        if found_base is None:
            return None
        recorded = found_base
        real = _identities(base, recorded)
    if not unreadable and not (links and recorded):
        return _still_linked(rootfs, recorded, real)
    found: list[Mode] = []
    parent_fd, name = open_parent(rootfs)
    try:
        for dir_fd, rel, _dirs, others in walk_dir_fds(parent_fd, name, strict=True):
            prefix = f"{rel}/" if rel else ""
            for entry in sorted(others):
                mode = _owner_readable(dir_fd, entry, real)
                if mode is not None:
                    found.append((prefix + entry, mode))
    except OSError as exc:
        raise translate_oserror(exc, f"making the files of {rootfs} readable") from exc
    finally:
        os.close(parent_fd)
    return found


def _owner_readable(dir_fd: int, name: str, real: dict[Identity, int]) -> int | None:
    """The image's mode of file ``name`` of ``dir_fd`` when it differs from its mode now
    (made ``u+r`` here, or before: ``real``), else None."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        return None
    known = real.get(identity(st))
    if known is not None:
        return known
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IRUSR:
        return None
    fd = os.open(name, _FILE_PATH, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # pragma: no cover - the tree is private
            return None
        mode = stat.S_IMODE(st.st_mode)
        chmod_path_fd(fd, mode | stat.S_IRUSR)
    finally:
        os.close(fd)
    real[identity(st)] = mode
    return mode


def _still_linked(rootfs: Path, recorded: list[Mode], real: dict[Identity, int]) -> list[Mode]:
    """The paths of ``recorded`` that name the same inode in ``rootfs`` as in the base."""
    kept: list[Mode] = []
    for rel, mode in recorded:
        try:
            st = _lstat_beneath(rootfs, rel)
        except OSError:
            continue  # removed, or under a path that is no directory now
        if real.get(identity(st)) == mode:
            kept.append((rel, mode))
    return kept


def _identities(base: Path, recorded: Iterable[Mode]) -> dict[Identity, int]:
    """The inode of each recorded path of ``base`` with the image's mode of it."""
    found: dict[Identity, int] = {}
    for rel, mode in recorded:
        with contextlib.suppress(OSError):
            found[identity(_lstat_beneath(base, rel))] = mode
    return found


def write_modes(directory: Path, modes: Sequence[Mode]) -> None:
    """Write ``directory/snapshot.modes`` (which must not exist yet)."""
    fd = os.open(directory / MODES, _NEW_FILE, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(HEADER)
        for rel, mode in modes:
            out.write(os.fsencode(rel) + b"\0" + b"%o" % mode + b"\0")


def read_modes(directory: Path) -> list[Mode] | None:
    """The record of the snapshot at ``directory``; None if it has none (made by an older
    ocistage). A StoreError if it is damaged or cannot be read."""
    try:
        fd = os.open(directory / MODES, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise translate_oserror(exc, f"reading {directory / MODES}") from exc
    with os.fdopen(fd, "rb") as file:
        data = file.read(MAX_RECORD_BYTES + 1)
    if not data.startswith(HEADER) or len(data) > MAX_RECORD_BYTES:
        raise _damaged(directory)
    fields = data[len(HEADER):].split(b"\0")
    if fields.pop() != b"" or len(fields) % 2:
        raise _damaged(directory)
    modes: list[Mode] = []
    for raw_path, raw_mode in zip(fields[::2], fields[1::2], strict=True):
        rel = os.fsdecode(raw_path)
        try:
            mode = int(raw_mode, 8)
        except ValueError:
            raise _damaged(directory) from None
        if not _relative(rel) or mode & ~0o7777:
            raise _damaged(directory)
        modes.append((rel, mode))
    return modes


def _damaged(directory: Path) -> StoreError:
    return StoreError(f"the record of file modes {directory / MODES} is damaged",
                      "run `ocistage cache verify`; the snapshot is made again from the "
                      "verified blobs once it is removed")


def _relative(rel: str) -> bool:
    return bool(rel) and not rel.startswith("/") and all(
        part not in ("", ".", "..") for part in rel.split("/"))


def restore_modes(rootfs: Path, modes: Iterable[Mode]) -> None:
    """Give each recorded path of ``rootfs`` (a private copy of a snapshot) the image's mode
    back; every path is resolved beneath ``rootfs`` without following a link (StoreError)."""
    try:
        for rel, mode in modes:
            fd = _open_beneath(rootfs, rel)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise StoreError(f"{rootfs / rel} is no regular file, as recorded",
                                     "the snapshot it was copied from changed: run "
                                     "`ocistage cache verify`")
                chmod_path_fd(fd, mode)
            finally:
                os.close(fd)
    except OSError as exc:
        raise translate_oserror(exc, f"restoring the image's file modes in {rootfs}") from exc


def _open_beneath(root: Path, rel: str) -> int:
    """An ``O_PATH`` descriptor of ``root/rel``, each component opened without following a
    link (``rel`` from a record: relative, no ``..``)."""
    if not _relative(rel):
        raise StoreError(f"invalid path {rel!r} in a record of file modes")
    *parents, last = rel.split("/")
    fd = os.open(root, DIR_PATH)
    try:
        for part in parents:
            child = os.open(part, DIR_PATH, dir_fd=fd)
            os.close(fd)
            fd = child
        return os.open(last, _FILE_PATH, dir_fd=fd)
    finally:
        os.close(fd)


def _lstat_beneath(root: Path, rel: str) -> os.stat_result:
    fd = _open_beneath(root, rel)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)
