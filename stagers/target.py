"""The target directory of staging: names, per-name locks, scratch dirs, atomic publish.

The layout of a target is defined once, in :mod:`ocistage.cache.targetlayout`. A version is built
in a
scratch dir and published by ``rename()``, or by an atomic ``renameat2(RENAME_EXCHANGE)`` with
the previous version (then removed). Scratch dirs whose owner died (kill -9, node crash) are
removed by the next stager of the same name, under its lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import stat
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from ocistage.cache.ancestors import check_path_trusted
from ocistage.cache.bundleinfo import SHARED_ROOT_ANNOTATION
from ocistage.cache.dirfds import DIR_READ, identity
from ocistage.cache.dirtrust import trust_problem
from ocistage.cache.errors import LockTimeout, StoreError, UntrustedPath
from ocistage.cache.linkprobes import hardlinks_work
from ocistage.cache.locks import FileLock
from ocistage.cache.owneddirs import OWNER_SUFFIX, drop_owned_dir, make_owned_dir
from ocistage.cache.privatedirs import PRIVATE_DIR_MODE
from ocistage.cache.targetlayout import (
    RESERVED_PREFIX,
    outer_marker_name,
    plain_name,
    shared_target,
    tmp_name,
)
from ocistage.cache.treeremoval import remove_tree
from ocistage.errors import UsageError
from ocistage.stagers.errors import StageError, StageUsageError


class Method(StrEnum):
    """How the files of a directory bundle get to the target (:func:`choose_method`); each has
    its placer (:mod:`ocistage.stagers.placers`). A ``str``: markers, manifests and results
    record it as its name."""

    HARDLINK = "hardlink"  # a link of the source file: no byte copied
    POOL = "pool"          # a link of the target's pool entry, copied once per content
    COPY = "copy"          # an independent copy


Format = Literal["dir", "squashfs"]
LOCK_TIMEOUT = 3600.0


@dataclass(frozen=True)
class StageResult:
    path: Path
    files: int           # regular files in the staged tree
    copied: int          # files whose bytes were copied (into the bundle or the pool)
    linked: int          # files hardlinked from the source or the pool without copying
    unchanged: int       # files already staged identically (nothing done)
    bytes_copied: int
    lease_id: str | None
    method: str          # hardlink | pool | copy | squashfs-mount | squashfs-unpack


#: the longest name a file system takes (NAME_MAX on Linux)
NAME_MAX = 255
#: what ocistage adds to NAME at most in the names it makes for it: the temp file of an outer
#: marker, ``..NAME.ocistage-staged.json.<pid>.tmp`` (35 with a 7-digit pid; pid_max is at
#: most 2**22); a retired version ``.ocistage-retired-NAME.<10 hex>`` takes 29, a scratch
#: dir's owner file ``NAME.<pid>-<10 hex>.owner`` and a stale lock set aside
#: ``NAME.lock.stale-<12 hex>`` 25 and 24, the image ``NAME.sqfs`` 5
NAME_RESERVE = 1 + len(outer_marker_name("")) + len(".4194304.tmp")
#: the longest staged NAME: every name derived from it fits (a retired name that did not
#: fit made a re-stage under a live job delete the version the job held)
MAX_NAME = NAME_MAX - NAME_RESERVE


def check_name(name: str) -> str:
    if not plain_name(name) or "\0" in name or name.startswith(RESERVED_PREFIX):
        raise StageUsageError(f"invalid staged name {name!r}",
                              "a name is one path component and must not start with '.ocistage'")
    if len(os.fsencode(name)) > MAX_NAME:
        raise UsageError(f"the staged name {name[:40]}... is {len(os.fsencode(name))} bytes "
                         f"long", f"a staged name has at most {MAX_NAME} bytes (ocistage adds "
                         f"up to {NAME_RESERVE} to it in the target); choose a shorter --name")
    return name


# -- publishing -----------------------------------------------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2() -> Callable[..., int] | None:
    libc = ctypes.CDLL(None, use_errno=True)
    function = getattr(libc, "renameat2", None)
    if function is None:
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                         ctypes.c_uint]
    function.restype = ctypes.c_int
    result: Callable[..., int] = function
    return result


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (``renameat2(RENAME_EXCHANGE)``); False if unsupported."""
    function = _renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))


def publish(scratch: Path, final: Path) -> Path | None:
    """Move ``scratch`` to ``final``; returns where the previous version now is (to remove)."""
    try:
        os.rename(scratch, final)
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise
    if os.path.islink(final) or not os.path.isdir(final):
        raise StageError(f"{final} exists and is not a staged bundle",
                         "choose another --name or remove it")
    if exchange(scratch, final):
        return scratch
    # no RENAME_EXCHANGE (e.g. NFS): move the old one aside first; NAME is briefly absent
    aside = scratch.with_name(scratch.name + ".old")
    os.rename(final, aside)
    os.rename(scratch, final)
    return aside


# -- scratch space and locks ------------------------------------------------------------------

#: a per-user directory of ``TO`` (scratch dir, pool) that vanished or turned out to be
#: another's while being entered is looked up again at most this often
ENTER_ATTEMPTS = 5
SQUAT_HINT = ("another user made that name first (in a sticky directory every user may make "
              "names), and ocistage never uses what another user made there: ask them or an "
              "administrator to remove it, or stage elsewhere (--to DIR)")


def target_is_shared(to: Path) -> bool:
    """Whether the (trusted, existing) target ``to`` is shared by users
    (:func:`ocistage.cache.targetlayout.shared_target`): then its scratch dir and pool are per
    user."""
    return shared_target(os.stat(to))


def own_dir(to: Path, name: str, what: str, mode: int = PRIVATE_DIR_MODE) -> int:
    """``TO/name`` made (one ``mkdir`` with ``mode``) if missing, opened without following a
    link or waiting on a FIFO, and checked to be a directory of the caller (or root) that
    others cannot write (:func:`ocistage.cache.dirtrust.trust_problem`); returns the opened
    directory. In a shared target a co-tenant may have made the name first, as anything:
    that is an :class:`UntrustedPath` naming them, with a hint, and nothing of theirs is
    used or touched."""
    path = to / name
    for _ in range(ENTER_ATTEMPTS):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, mode)
        try:
            fd = os.open(path, DIR_READ | os.O_NONBLOCK)
        except FileNotFoundError:
            continue  # an empty one of ours removed in between (remove_tmp_dir)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            _refuse(path, what, os.lstat(path))
        problem = trust_problem(os.fstat(fd))
        if problem is None:
            return fd
        os.close(fd)
        _refuse(path, what, os.lstat(path))
    raise StageError(f"cannot make {what} {path}: it keeps disappearing",
                     "another process removes it; try again")


def _refuse(path: Path, what: str, st: os.stat_result) -> None:
    problem = trust_problem(st)
    if problem is None:  # replaced by a directory of ours since it was opened
        problem = "changed while it was opened"
    raise UntrustedPath(f"refusing {what} {path}: it {problem}",
                        SQUAT_HINT if st.st_uid != os.geteuid() else None)


def _check_target(to: Path) -> str:
    check_path_trusted(to, "stage target", make=0o755, shared=True)
    return tmp_name(target_is_shared(to))


def take_name_lock(to: Path, name: str, timeout: float = LOCK_TIMEOUT) -> FileLock:
    """Take ``NAME``'s lock in the caller's scratch dir of ``TO``, waiting up to ``timeout``
    seconds for another stager of ``NAME``. The scratch dir
    (:func:`ocistage.cache.targetlayout.tmp_name`) is made if needed; ``TO`` and it must be
    trusted (docs/trust.md): every directory above ``TO``
    (:func:`ocistage.cache.ancestors.walk_trusted`), ``TO`` owned by the caller or root and not
    writable by others, or a sticky directory like ``/tmp`` (shared: the scratch dir is
    ``.ocistage-tmp-<uid>``, and must be the caller's, :func:`own_dir`). This is the one check
    of them: the lock's directory (``lock.path.parent``) stays the checked one while the lock
    is held, and is where the stager's scratch dirs go (:func:`new_scratch`).

    The scratch dir is removed by the last stager that leaves it empty
    (:func:`remove_tmp_dir`), and in a shared target another user could then make its name:
    so the lock is known to be in the directory that was checked, and that directory to be
    at its name, only once the lock file is in it (a directory with an entry is never
    removed by a stager, and in a sticky target nobody else may remove or rename one of
    ours). If it vanished or was replaced meanwhile, the lock is dropped and taken again."""
    deadline = time.monotonic() + timeout
    scratch_name = _check_target(to)
    while True:
        fd = own_dir(to, scratch_name, "staging scratch directory")
        try:
            lock = FileLock(to / scratch_name / f"{name}.lock")
            try:
                lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
            except StoreError as exc:
                if not isinstance(exc.__cause__, FileNotFoundError):
                    raise
            else:
                if in_checked_dir(fd, f"{name}.lock", to / scratch_name):
                    return lock
                lock.release()
        finally:
            os.close(fd)
        # the directory went while this waited (its last stager left it empty), or was
        # replaced: look it up again
        if time.monotonic() > deadline:
            raise LockTimeout(f"timed out waiting for lock {lock.path}")


def in_checked_dir(fd: int, entry: str, path: Path) -> bool:
    """Whether ``entry`` is in the opened directory ``fd``, and ``fd`` is at ``path``."""
    try:
        os.stat(entry, dir_fd=fd, follow_symlinks=False)
        return identity(os.lstat(path)) == identity(os.fstat(fd))
    except OSError:
        return False


def remove_tmp_dir(tmp: Path) -> None:
    """Remove the caller's scratch dir ``tmp`` of a target if it is empty (the last stager
    using it has ended); never one that is not a directory of the caller's, never through a
    link, and never waiting (issue 34). A stager entering it at the same time makes it again
    (:func:`take_name_lock`)."""
    with contextlib.suppress(OSError):
        fd = os.open(tmp, DIR_READ | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or os.listdir(fd):
                return
            if identity(os.lstat(tmp)) == identity(st):
                os.rmdir(tmp)  # fails if a stager has made an entry since
        finally:
            os.close(fd)


def clean_leftovers(tmp: Path, name: str) -> None:
    """Remove the scratch dirs that earlier stagers of ``name`` left (killed, crashed) in the
    caller's scratch dir ``tmp`` of the target.

    Call it holding ``name``'s lock: no live stager of ``name`` can own a scratch dir then
    (a lock is only broken when its owner is dead or stopped heart-beating), so their owners'
    liveness need not be guessed — an ``.owner`` file is not heart-beaten, and on a shared
    filesystem a builder on another node would look dead after a minute. Scratch dirs of other
    names are left to their own stagers.
    """
    pattern = re.compile(
        rf"{re.escape(name)}\.\d+-[0-9a-f]{{10}}(\.old|{re.escape(OWNER_SUFFIX)})?")
    try:
        names = os.listdir(tmp)
    except FileNotFoundError:
        return
    for entry in names:
        if pattern.fullmatch(entry):
            remove_tree(tmp / entry)


def new_scratch(tmp: Path, name: str) -> Path:
    """A new private scratch dir for ``name`` in the caller's checked scratch dir ``tmp`` of
    the target (the directory of ``name``'s lock, :func:`take_name_lock`)."""
    return make_owned_dir(tmp / f"{name}.{os.getpid()}-{uuid.uuid4().hex[:10]}")


def drop_scratch(scratch: Path) -> None:
    drop_owned_dir(scratch)


# -- the staged state -----------------------------------------------------------------------

def source_identity(source: Path, cache_root: Path) -> str:
    """A token that changes whenever a *sealed* source could have changed; "" if not sealed.

    Sealed sources are bundles in the cache: published once by rename and never written.
    """
    bundles = (cache_root / "bundles").absolute()
    try:
        resolved = source.resolve()
        if resolved.parent != bundles.resolve():
            return ""
        root = os.lstat(resolved)
        config = os.lstat(resolved / "config.json")
    except OSError:
        return ""
    return (f"{resolved}:{root.st_dev}:{root.st_ino}:{root.st_mtime_ns}:"
            f"{config.st_ino}:{config.st_mtime_ns}:{config.st_size}")


def choose_method(source: Path, to: Path, tmp: Path, link: bool | None,
                  sealed: bool) -> Method:
    """How ``source`` is staged into ``to``. Only a *sealed* source (a bundle in the cache,
    :func:`source_identity`, whose files nobody writes) may share inodes with a staged tree:
    any other tree (a ``bundle REF DEST``, a directory of the user's) is writable, and a
    hardlink would let a write there change the staged copy; it goes through the target's
    pool (our own read-only copies) or is copied. (Whether links work is tried only for a
    sealed source: the trial links a file of the source, which moves its ctime, into ``tmp``,
    the caller's checked scratch dir of ``to``.)"""
    if link is False:
        return Method.COPY
    if link is None and not sealed:
        return Method.POOL
    same = hardlinks_between(source, tmp)
    if link is True and not same:
        raise StageError(f"cannot hardlink: {source} and {to} are on different filesystems "
                         f"or mount points", "drop --link to copy through the target's pool "
                                             "instead")
    if link is True and not sealed:
        raise StageError(f"cannot hardlink {source}: only a bundle in the cache may share "
                         "its files with a staged copy (this tree can be written)",
                         "stage the image by its REF, or drop --link to copy through the "
                         "target's pool")
    return Method.HARDLINK if same and sealed else Method.POOL


def hardlinks_between(source: Path, tmp: Path) -> bool:
    """Whether files of the tree ``source`` can be hard-linked into a target: a regular file at
    its top (``config.json`` first) is linked into the caller's scratch dir ``tmp`` of the
    target (:func:`take_name_lock`) for real, since two
    mount points of one filesystem (bind mounts, per-job tmpfs namespaces) share ``st_dev``
    but refuse links with EXDEV. A tree without such a file compares ``st_dev``."""
    candidates = [source / "config.json"]
    with contextlib.suppress(OSError), os.scandir(source) as entries:
        candidates.extend(Path(e.path) for e in entries if e.is_file(follow_symlinks=False))
    for candidate in candidates:
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(candidate).st_mode):
                return hardlinks_work(candidate, tmp)
    return os.stat(source).st_dev == os.stat(tmp).st_dev




def _runtime_config(data: bytes) -> dict[str, Any] | None:
    try:
        config = json.loads(data)
    except ValueError:
        return None
    if not isinstance(config, dict) or not isinstance(config.get("root"), dict):
        return None
    return config


def readonly_config(data: bytes) -> bytes | None:
    """config.json with ``root.readonly`` set, or None if it is not a runtime config.

    A root made read-only here (because the staged files are shared) is marked with
    :data:`SHARED_ROOT_ANNOTATION`, so that a private copy can be made writable again.
    """
    config = _runtime_config(data)
    if config is None:
        return None
    if not config["root"].get("readonly"):
        config["root"]["readonly"] = True
        annotations = config.setdefault("annotations", {})
        if isinstance(annotations, dict):
            annotations[SHARED_ROOT_ANNOTATION] = "true"
    return json.dumps(config, indent=2).encode() + b"\n"


def writable_config(data: bytes) -> bytes | None:
    """config.json of a private copy: the root writable again if it was read-only only because
    its files were shared; None when nothing needs to change (or it is not a runtime config)."""
    config = _runtime_config(data)
    if config is None:
        return None
    annotations = config.get("annotations")
    if not isinstance(annotations, dict) or SHARED_ROOT_ANNOTATION not in annotations:
        return None
    del annotations[SHARED_ROOT_ANNOTATION]
    config["root"]["readonly"] = False
    return json.dumps(config, indent=2).encode() + b"\n"


def write_private(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Create ``path`` (never an existing one, never through a symlink) with ``data``, or
    the pieces it yields."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        if isinstance(data, bytes):
            out.write(data)
        else:
            out.writelines(data)

