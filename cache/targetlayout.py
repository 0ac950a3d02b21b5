"""Staged bundles: the one definition of the layout ``stagers/`` writes into a target, and
removing a staged bundle.

``stagers`` puts bundles outside the cache and records a lease ``staged:<path>`` for each;
``cache gc`` removes a staged bundle once all its leases are dead. Both sides need the layout,
and ``stagers`` imports ``cache``, never the reverse: so the layout is defined here, once, and
``stagers`` takes every name below from this module (docs/staging.md)::

    TARGET/NAME/                          a staged tree
    TARGET/NAME/.ocistage-manifest.json   its file manifest (ocistage.stagers.filemanifest)
    TARGET/NAME/.ocistage-staged.json     the marker: {"id": <lease id>, "method", "format",
                                          "image": <squashfs image file name beside NAME>, ...}
    TARGET/.NAME.ocistage-staged.json     the outer marker of a mounted image whose own marker
                                          (read-only, inside the image) names no lease of this
                                          cache: an image fetched from a URL; or, with
                                          ``"removing": true``, of a bundle being removed
    TARGET/NAME.sqfs                      the squashfs image of NAME (``--format squashfs``)
    TARGET/.ocistage-pool/<hh>/<key>      file contents shared by the target's bundles; an
                                          entry with link count 1 is used by no bundle;
                                          ``<key>.<pid>-<random>.tmp``: one being written
    TARGET/.ocistage-tmp/NAME.lock        the lock of a stager working on NAME
    (ocistage.cache.locks)
    TARGET/.ocistage-tmp/NAME.<pid>-<random>[.owner]   scratch dir of a stager, its owner

In a *shared* target, a sticky directory every user may write (``/scratch/bundles``, mode
1777), each user has their own pool and scratch dir, ``.ocistage-pool-<uid>`` and
``.ocistage-tmp-<uid>`` (:func:`pool_name`, :func:`tmp_name`): only entries a user made are
used there, and a directory another user made first could never be (docs/trust.md). A
target of one user (theirs or root's, not writable by others) keeps the plain names. The
scratch dir is made when a staging starts and removed when the last staging using it ends
and leaves it empty; a pool stays.

Names starting with ``.ocistage`` are reserved: no bundle may be staged under one.

Removal never follows a symlink: ``NAME`` is opened with ``O_NOFOLLOW`` relative to its
parent, a squashfs mount (a different ``st_dev`` than the parent's) is unmounted first, and
a directory is removed through descriptors (:mod:`ocistage.cache.treeremoval`).

A removal that is interrupted (killed, a busy unmount) must leave something ``unstage`` and
``cache gc`` recognise: before anything is removed, the outer marker is written with
``"removing": true`` and a lease that the remover holds (:func:`mark_removing`), and it is
removed last. Unmounting an image takes its marker with it; what is left then (an empty
``NAME/`` or none, ``NAME.sqfs``) is a *remnant* that :func:`open_staged` opens by that outer
marker, and :func:`remove` finishes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ocistage.cache.dirfds import DIR_FOLLOW, DIR_READ
from ocistage.cache.dirtrust import trust_problem
from ocistage.cache.errors import ForeignFile, StoreError
from ocistage.cache.readback import read_own
from ocistage.cache.treeremoval import remove_at, remove_opened

RESERVED_PREFIX = ".ocistage"
MARKER_NAME = ".ocistage-staged.json"
MANIFEST_NAME = ".ocistage-manifest.json"
POOL_DIR = ".ocistage-pool"
POOL_TEMP_SUFFIX = ".tmp"
TMP_DIR = ".ocistage-tmp"
RETIRED_PREFIX = ".ocistage-retired-"  # + NAME.<rand>: a replaced version jobs may still use
IMAGE_SUFFIX = ".sqfs"
UNMOUNT_TIMEOUT = 60
TEMP_GRACE = 3600.0   # a named temp file in the pool younger than this may be being written
MAX_MARKER_BYTES = 1 << 16
REMOVING = "removing"  # outer marker key: the bundle beside it is being removed
_NAME_MAX = 255  # bytes of one file name (NAME_MAX)


def shared_target(st: os.stat_result) -> bool:
    """Whether the target directory ``st`` is shared by users: sticky, so that every user
    may add entries (and remove only their own), as ``/tmp`` and ``/scratch`` are."""
    return bool(st.st_mode & stat.S_ISVTX)


def _per_user(name: str, shared: bool, uid: int | None) -> str:
    return f"{name}-{os.geteuid() if uid is None else uid}" if shared else name


def tmp_name(shared: bool, uid: int | None = None) -> str:
    """The caller's (or ``uid``'s) scratch dir in a target: :data:`TMP_DIR` in a target of
    one user, ``.ocistage-tmp-<uid>`` in a :func:`shared_target`."""
    return _per_user(TMP_DIR, shared, uid)


def pool_name(shared: bool, uid: int | None = None) -> str:
    """The caller's (or ``uid``'s) pool in a target: :data:`POOL_DIR` in a target of one
    user, ``.ocistage-pool-<uid>`` in a :func:`shared_target`."""
    return _per_user(POOL_DIR, shared, uid)


def outer_marker_name(name: str) -> str:
    """File name (beside ``NAME``) of the outer marker of the staged bundle ``NAME``."""
    return f".{name}{MARKER_NAME}"


def image_path(final: Path) -> Path:
    """``TARGET/NAME.sqfs``: where the squashfs image of the bundle staged at ``final`` lives."""
    return final.with_name(final.name + IMAGE_SUFFIX)


def read_json_at(dir_fd: int, name: str) -> dict[str, object] | None:
    """The JSON object in file ``name`` of ``dir_fd``; None if absent, unreadable, not an
    object, or not a regular file of the caller or root (a symlink, a FIFO a co-tenant made
    beside a bundle in a sticky target, their file: :mod:`ocistage.cache.readback`)."""
    try:
        data = json.loads(read_own(name, MAX_MARKER_BYTES, dir_fd))
    except (OSError, ValueError, ForeignFile):
        return None
    return data if isinstance(data, dict) else None


def image_name(marker: dict[str, object]) -> str | None:
    """The squashfs image file name a marker names, if it is a plain name."""
    image = marker.get("image")
    return image if isinstance(image, str) and plain_name(image) else None


def plain_name(name: str) -> bool:
    """One path component: no ``/``, not empty, ``.`` or ``..``."""
    return "/" not in name and name not in ("", ".", "..")


@dataclass(frozen=True)
class StagedBundle:
    """A staged bundle opened for removal: ``fd`` is ``parent/name`` opened without following
    a link; :meth:`close` (or :func:`remove`) closes it."""

    parent_fd: int
    parent: Path
    name: str
    fd: int
    marker: dict[str, object]
    outer: dict[str, object] | None   # the outer marker, if there is one
    mounted: bool
    #: what an interrupted removal left (module docstring): ``fd`` an empty ``NAME/`` or -1,
    #: ``marker`` the outer marker
    remnant: bool = False

    def lease_ids(self) -> set[str]:
        """Lease ids the markers name (the outer one counts for a mounted image, and for a
        bundle being removed)."""
        ids = {self.marker.get("id")}
        if self.outer is not None and (self.mounted or removing(self.outer)):
            ids.add(self.outer.get("id"))
        return {i for i in ids if isinstance(i, str) and i}

    def _image_stat(self) -> tuple[str, os.stat_result] | None:
        # the image of NAME is NAME.sqfs by the layout; the marker only says there is one (a
        # marker is a file anyone who can write the bundle can edit: it never names what to
        # remove, or an edited one would make unstage or gc delete a sibling)
        image = self.name + IMAGE_SUFFIX
        if image_name(self.marker) != image:
            return None
        try:
            st = os.stat(image, dir_fd=self.parent_fd, follow_symlinks=False)
        except OSError:
            return None
        return (image, st) if stat.S_ISREG(st.st_mode) else None

    def image(self) -> str | None:
        """The image file beside the bundle that its marker names, if it is a regular file."""
        found = self._image_stat()
        return found[0] if found is not None else None

    def image_size(self) -> int:
        """The disk space of :meth:`image` (0 if there is none)."""
        found = self._image_stat()
        return found[1].st_blocks * 512 if found is not None else 0

    def close(self) -> None:
        for fd in (self.fd, self.parent_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


def removing(outer: dict[str, object] | None) -> bool:
    """Whether an outer marker says its bundle is being removed (:func:`mark_removing`)."""
    return outer is not None and outer.get(REMOVING) is True


def _ours_or_absent(dir_fd: int, name: str) -> bool:
    """Whether ``name`` in ``dir_fd`` is absent or a regular file of ours (in a sticky shared
    target it may be a co-tenant's, FIFO or file: never replaced or removed)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def mark_removing(bundle: StagedBundle, lease_id: str) -> None:
    """Write ``bundle``'s outer marker, saying it is being removed by the holder of
    ``lease_id``: a copy of its marker (the image it names too), written atomically. Not
    where another user's file has that name (then an interrupted removal is finished only
    while the bundle's own marker is left, as before)."""
    data = json.dumps({**bundle.marker, "id": lease_id, REMOVING: True}).encode()
    name = outer_marker_name(bundle.name)
    temp = f".{name}.{os.getpid()}.tmp"
    if len(os.fsencode(temp)) > _NAME_MAX or not _ours_or_absent(bundle.parent_fd, name):
        return  # a retired version of the longest names: no outer marker fits beside it
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644, dir_fd=bundle.parent_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.rename(temp, name, src_dir_fd=bundle.parent_fd, dst_dir_fd=bundle.parent_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=bundle.parent_fd)
        raise


def open_staged(path: Path) -> StagedBundle | None:
    """Open the staged bundle at ``path`` (absolute); None if it is absent, not a directory
    (a symlink is never followed) or carries no marker, unless it is the remnant of a removal
    (:func:`remnant_of`)."""
    parent, name = os.path.split(path)
    try:
        parent_fd = os.open(parent or "/", DIR_FOLLOW)
    except OSError:
        return None
    try:
        fd = os.open(name, DIR_READ, dir_fd=parent_fd)
    except OSError:
        fd = -1
    marker = read_json_at(fd, MARKER_NAME) if fd >= 0 else None
    if marker is None:
        remnant = remnant_of(parent_fd, Path(parent), name, fd)
        if remnant is None:
            for opened in (fd, parent_fd):
                if opened >= 0:
                    os.close(opened)
        return remnant
    mounted = os.fstat(fd).st_dev != os.fstat(parent_fd).st_dev
    outer = read_json_at(parent_fd, outer_marker_name(name))
    return StagedBundle(parent_fd, Path(parent), name, fd, marker, outer, mounted)


def remnant_of(parent_fd: int, parent: Path, name: str, fd: int) -> StagedBundle | None:
    """The remnant of an interrupted removal of ``name`` (``fd``: ``NAME/`` opened, without a
    marker, or -1 if it is gone): a bundle whose marker is the outer marker, if that says
    ``removing`` and ``NAME/`` (if any) is an empty directory on the parent's filesystem (the
    mount point an unmount left); else None. Closes nothing."""
    outer = read_json_at(parent_fd, outer_marker_name(name))
    if outer is None or not removing(outer) or (fd >= 0 and not _empty_here(fd, parent_fd)):
        return None
    return StagedBundle(parent_fd, parent, name, fd, outer, outer, False, remnant=True)


def _empty_here(fd: int, parent_fd: int) -> bool:
    try:
        return os.fstat(fd).st_dev == os.fstat(parent_fd).st_dev and not os.listdir(fd)
    except OSError:
        return False


def unmount(mountpoint: Path, *, lazy: bool = False) -> None:
    """Unmount a FUSE mount: ``fusermount3 -u``, ``fusermount -u`` or ``umount``. ``lazy``
    (``-z``, ``umount -l``): detach it now even while it is in use; whoever uses it (a running
    container) goes on reading it, and the filesystem goes when the last of them is done."""
    for tool in ("fusermount3", "fusermount", "umount"):
        path = shutil.which(tool)
        if path is None:
            continue
        flags = (["-l"] if lazy else []) if tool == "umount" else (
            ["-u", "-z"] if lazy else ["-u"])
        argv = [path, *flags, os.fspath(mountpoint)]
        try:
            result = subprocess.run(argv, capture_output=True, text=True,
                                    timeout=UNMOUNT_TIMEOUT, stdin=subprocess.DEVNULL,
                                    check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if result.returncode == 0 or not os.path.ismount(mountpoint):
            return
    raise StoreError(f"cannot unmount {mountpoint}",
                     f"unmount it yourself (fusermount -u {mountpoint}) and retry")


def take_down(bundle: StagedBundle) -> None:
    """Remove the tree of ``bundle``: unmount a mounted image (then remove the empty mount
    point), or remove the directory through descriptors; of a remnant, only an empty
    directory. Closes ``bundle.fd``."""
    if bundle.remnant:
        if bundle.fd >= 0:
            os.close(bundle.fd)
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(bundle.name, dir_fd=bundle.parent_fd)  # never a full one
        return
    if bundle.mounted:
        os.close(bundle.fd)  # an open descriptor would keep the mount busy
        unmount(bundle.parent / bundle.name)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(bundle.name, dir_fd=bundle.parent_fd)
        return
    try:
        # the marker goes last: a removal that stops half-way (an entry it may not remove)
        # leaves a bundle that unstage and GC still recognise, and try again
        for entry in os.listdir(bundle.fd):
            if entry != MARKER_NAME:
                remove_at(bundle.fd, entry)
        remove_opened(bundle.parent_fd, bundle.name, bundle.fd)
    finally:
        os.close(bundle.fd)


def remove_beside(bundle: StagedBundle) -> None:
    """Remove what belongs to ``bundle`` beside it: the image its marker names; for a pool
    bundle, every pool entry that no bundle links to any more; the outer marker last."""
    image = bundle.image()
    if image is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(image, dir_fd=bundle.parent_fd)
    if bundle.marker.get("method") == "pool":
        sweep_pool(bundle.parent)
    drop_outer_marker(bundle)


def drop_outer_marker(bundle: StagedBundle) -> None:
    """Remove the outer marker beside ``bundle``, if it is a file of ours."""
    name = outer_marker_name(bundle.name)
    if _ours_or_absent(bundle.parent_fd, name):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=bundle.parent_fd)


def remove(bundle: StagedBundle, lease_id: str | None = None) -> None:
    """Take ``bundle`` down and remove what belongs to it (see above); closes it.
    ``lease_id``: a lease that stays until the removal is done (GC drops the dead leases of a
    bundle only after removing it), named in the outer marker first (:func:`mark_removing`),
    so an interrupted removal is recognised and finished by the next GC or unstage."""
    try:
        if lease_id is not None and not bundle.remnant:
            mark_removing(bundle, lease_id)
        take_down(bundle)
        remove_beside(bundle)
    finally:
        with contextlib.suppress(OSError):
            os.close(bundle.parent_fd)


def sweep_pool(target: Path) -> int:
    """Remove every entry of the caller's pools in ``target`` (:func:`pool_name`: either
    name, the target may have become shared) that no bundle links to (link count 1: also
    those a killed stager left); returns how many. Only regular files of the caller directly
    inside a pool's fan-out directories are looked at; nothing is followed. Safe beside
    running stagers: one that loses an entry copies it again."""
    return sum(_sweep_pool(target / name) for name in (pool_name(False), pool_name(True)))


def _sweep_pool(pool: Path) -> int:
    removed = 0
    try:
        pool_fd = os.open(pool, DIR_READ)
    except OSError:
        return 0
    uid = os.geteuid()
    try:
        if trust_problem(os.fstat(pool_fd)) is not None:
            return 0  # not our pool (docs/trust.md): nothing in it is ours to remove
        for fanout in os.listdir(pool_fd):
            try:
                fan_fd = os.open(fanout, DIR_READ, dir_fd=pool_fd)
            except OSError:
                continue
            try:
                for entry in os.scandir(fan_fd):
                    with contextlib.suppress(FileNotFoundError):
                        st = entry.stat(follow_symlinks=False)
                        if (entry.name.endswith(POOL_TEMP_SUFFIX)  # being written (no O_TMPFILE)
                                and time.time() - st.st_mtime < TEMP_GRACE):
                            continue
                        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == uid:
                            os.unlink(entry.name, dir_fd=fan_fd)
                            removed += 1
            finally:
                os.close(fan_fd)
    finally:
        os.close(pool_fd)
    return removed
