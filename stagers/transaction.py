"""One staging of ``NAME`` under a target: the sequence every kind of staging goes through.

Directory trees (:mod:`ocistage.stagers.directory`), squashfs images
(:mod:`ocistage.stagers.squashfs`)
and images
fetched from a URL (:mod:`ocistage.stagers.remote`) differ only in how they fill a scratch tree; the
sequence around that is this module's, written once::

    with Staging(to, name, cache_root=..., holder=..., what=...) as staging:
        staging.refuse_foreign("dir")        # what is at TO/NAME must be ours and of this format
        scratch = staging.scratch()          # TO/.ocistage-tmp[-<uid>]/NAME.<pid>-<random>
        ...                                  # the strategy fills it
        staging.publish(scratch)             # rename (or exchange) into TO/NAME; the
                                             # replaced version is retired: kept while a job
                                             # may run on it, else removed by a detached
                                             # remover (ocistage.stagers.retired)

Entering: make ``TO`` (a file there is refused), take ``NAME``'s lock, claim the holder's lease
*before* looking at what is staged (a GC that started earlier finishes first), remove the
scratch dirs of killed stagers of ``NAME`` and its retired versions that no live lease holds,
read the marker. Leaving normally: scratch dirs and
their ``.owner`` files are removed. Leaving by an exception: the scratch dirs are dropped, the
lease is released unless something published names it, pool entries that no bundle links to are
swept (a stage killed by a full disk leaves nothing behind that ``cache gc`` would never see),
and an ``OSError`` becomes one :class:`StageError` (a full disk says so, with a hint). The lock
is released either way, and then the caller's scratch dir of ``TO`` is removed if that left it
empty (:func:`ocistage.stagers.target.remove_tmp_dir`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from pathlib import Path
from types import TracebackType

from ocistage.cache import leases, targetlayout
from ocistage.cache.ancestors import walk_trusted
from ocistage.cache.atomicwrite import fsync_dir
from ocistage.cache.errors import LockTimeout, StoreError, UntrustedPath
from ocistage.cache.leases import Holder, Lease
from ocistage.cache.locks import FileLock
from ocistage.cache.privatedirs import PRIVATE_DIR_MODE, make_private
from ocistage.cache.targetlayout import image_path, sweep_pool
from ocistage.stagers import detach, retired
from ocistage.stagers.errors import StageError, StageUsageError
from ocistage.stagers.filemanifest import MANIFEST_NAME, Manifest, load_manifest
from ocistage.stagers.markers import (
    Claim,
    Marker,
    claim,
    live_leases,
    new_marker,
    read_marker,
    release_if_unused,
    staged_leases,
)
from ocistage.stagers.pool import Pool
from ocistage.stagers.removal import remove_in_workers
from ocistage.stagers.target import (
    LOCK_TIMEOUT,
    StageResult,
    check_name,
    clean_leftovers,
    drop_scratch,
    new_scratch,
    publish,
    remove_tmp_dir,
    take_name_lock,
)

#: errno values that mean "the target's filesystem is full" (space or quota)
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
_FORMATS = {"dir": "directory bundle", "squashfs": "squashfs image"}
log = logging.getLogger(__name__)


def make_target(to: Path) -> Path:
    """``to`` made absolute and created if missing, every directory above it checked first
    (:func:`ocistage.cache.ancestors.walk_trusted`, :class:`UntrustedPath`); a StageError if it
    is not a directory. Whether ``to`` itself is trusted is checked by
    :func:`ocistage.stagers.target.take_name_lock`."""
    to = Path(os.path.abspath(to))
    try:
        st = walk_trusted(to, "stage target", make=0o755)
    except (FileExistsError, NotADirectoryError) as exc:
        raise _not_a_directory(to) from exc
    except OSError as exc:
        raise staging_error(exc, f"cannot create the target {to}", to) from exc
    if not stat.S_ISDIR(st.st_mode):
        raise _not_a_directory(to)
    return to


def _not_a_directory(to: Path) -> StageError:
    return StageUsageError(f"the target {to} is not a directory",
                           "give --to a directory (it is created, with its parents, if "
                           "missing) or a URL")


def staging_error(exc: OSError, what: str, to: Path, source: str | None = None) -> StageError:
    """One StageError for ``exc`` met while doing ``what`` on the target ``to``; a file of
    ``source`` it may not read is the caller's, not the target's."""
    if exc.errno in _FULL:
        return StageError(f"{what}: no space left on the filesystem of {to}",
                          "free space there or stage elsewhere (--to); nothing partial "
                          "was left behind")
    detail = exc.strerror or str(exc)
    if exc.filename:
        detail += f" ({exc.filename})"
    if (exc.errno == errno.EACCES and source is not None and isinstance(exc.filename, str)
            and exc.filename.startswith(source.rstrip("/") + "/")):
        return StageError(f"{what}: cannot read {exc.filename}: {exc.strerror}",
                          "the source files must be readable by you")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StageError(f"{what}: {detail}", _not_writable_hint(to))
    return StageError(f"{what}: {detail}")


def _not_writable_hint(to: Path) -> str:
    return (f"you cannot write in the stage target {to}: stage to a directory of your own "
            "(--to DIR, $OCISTAGE_STAGE_TO), or ask its owner to let you write there")


class Staging:
    """The lock, lease, marker, scratch dirs and publication of one staging of ``to/name``."""

    def __init__(self, to: Path, name: str, *, cache_root: Path, holder: Holder,
                 what: str, local: bool = False) -> None:
        self.name = check_name(name)
        self.to = make_target(to)
        self.final = self.to / self.name
        self._cache_root = cache_root
        self._holder = holder
        self._local = local           # this node's own copy (--all-nodes): leases record it
        self.what = what              # the source, for messages
        self.marker: Marker | None = None
        self._claim: Claim | None = None
        self._scratches: list[Path] = []
        self._pool: Pool | None = None
        self._lock: FileLock | None = None
        self._tmp: Path | None = None
        self._users: list[Holder] | None = None
        self._remover: detach.Detached | None = None

    @property
    def lease(self) -> Lease:
        """The holder's lease on ``TO/NAME`` (:func:`ocistage.stagers.markers.claim`)."""
        assert self._claim is not None, "use Staging as a context manager"
        return self._claim.lease

    @property
    def tmp(self) -> Path:
        """The caller's scratch dir of ``TO``: the directory of ``NAME``'s lock, checked once
        when the lock was taken (:func:`ocistage.stagers.target.take_name_lock`)."""
        assert self._tmp is not None, "use Staging as a context manager"
        return self._tmp

    # -- the sequence -----------------------------------------------------------------------

    def __enter__(self) -> Staging:
        try:
            lock = take_name_lock(self.to, self.name, LOCK_TIMEOUT)
        except OSError as exc:
            raise staging_error(exc, f"cannot lock {self.final}", self.to) from exc
        except StoreError as exc:  # the lock file in the target, not the cache
            if isinstance(exc, LockTimeout | UntrustedPath):
                raise
            raise StageError(exc.message, _not_writable_hint(self.to)) from exc
        self._lock = lock
        self._tmp = lock.path.parent  # checked with the lock (take_name_lock)
        try:
            self._claim = claim(self._cache_root, self.final, self._holder, local=self._local)
            clean_leftovers(self.tmp, self.name)
            retired.sweep(self.to, self.name, self._cache_root)  # of jobs that have ended
            finish_removal(self.final, self._cache_root)
            self.marker = read_marker(self.final)
        except OSError as exc:
            self._undo()
            raise self._error(exc) from exc
        except BaseException:
            self._undo()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if exc is None:
            try:
                for scratch in self._scratches:
                    with contextlib.suppress(OSError):  # else the next stager of NAME does
                        drop_scratch(scratch)
            finally:
                self._release_lock()
            return
        self._undo()
        if isinstance(exc, OSError):
            raise self._error(exc) from exc

    def _undo(self) -> None:
        """After a failure: drop the scratch dirs, release the lease unless something
        published names it, sweep unused pool entries; release the lock."""
        try:
            for scratch in self._scratches:
                with contextlib.suppress(OSError):
                    drop_scratch(scratch)
            if self._claim is not None:
                with contextlib.suppress(OSError):
                    release_if_unused(self._claim)
            if self._pool is not None:
                with contextlib.suppress(OSError):
                    sweep_pool(self.to)
        finally:
            self._release_lock()

    def _keep(self, replaced: Path) -> None:
        """A replaced version that could not be retired is never dropped with the scratch dirs:
        a job may be running on it."""
        self._scratches = [s for s in self._scratches
                           if s != replaced and s not in replaced.parents]
        log.warning("the replaced version of %s, which a running job may use, stays at %s",
                    self.final, replaced)

    def _release_lock(self) -> None:
        """Release the lock (and a remover that was not needed), then remove the scratch dir
        if this left it empty."""
        if self._remover is not None:
            self._remover.cancel()
            self._remover = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
            remove_tmp_dir(self.tmp)

    def _error(self, exc: OSError) -> StageError:
        return staging_error(exc, f"staging {self.what} to {self.final} failed", self.to,
                             self.what)

    # -- what is staged ---------------------------------------------------------------------

    def refuse_foreign(self, format: str) -> None:
        """Refuse ``TO/NAME`` unless it is absent, staged by ocistage as ``format``, or the
        empty mount point of a squashfs image of ``NAME`` (unmounted: the image is beside it).
        """
        marker = self.marker
        if marker is None and os.path.lexists(self.final):
            if not _empty_dir(self.final):
                raise StageError(f"{self.final} exists and was not staged by ocistage",
                                 "choose another --name or target, or remove it yourself")
            if not os.path.isfile(image_path(self.final)):
                raise StageError(f"{self.final} exists and was not staged by ocistage "
                                 "(an empty directory)",
                                 "choose another --name or target, or remove it yourself")
            found = "squashfs"
        elif marker is None:
            return
        else:
            found = marker.format
        if found != format:
            raise StageError(f"{self.final} holds a staged {_FORMATS.get(found, found)}, "
                             f"not a {_FORMATS.get(format, format)}",
                             f"unstage it first (ocistage unstage {self.final}) or use --name")

    def previous(self) -> Manifest | None:
        """The manifest of the version staged now (None if nothing of ours is there)."""
        if self.marker is None:
            return None
        return load_manifest(self.final / MANIFEST_NAME)

    def unchanged(self, files: int, method: str) -> StageResult:
        """The result of a staging that found nothing to do (``TO/NAME`` made owner-only if
        an older ocistage left it open: docs/trust.md rule 3)."""
        with contextlib.suppress(OSError):  # a mounted image's root cannot change
            make_private(self.final)
        return StageResult(self.final, files, 0, 0, files, 0, self.lease.id, method)

    def new_marker(self, source: str, method: str, format: str = "dir",
                   image: str | None = None, *, tree: str = "", sealed: str = "",
                   files: int = 0) -> Marker:
        """The marker of the version being made, naming this staging's lease."""
        return new_marker(self.lease, source, method, format, image, tree=tree,
                          sealed=sealed, files=files)

    # -- making and publishing a version ----------------------------------------------------

    def scratch(self, remover: bool = True) -> Path:
        """A new private scratch dir beside ``TO/NAME``; removed when the staging ends. A new
        version is about to be built: if it will replace one that nobody runs on, the remover
        of that one is started now (:meth:`start_remover`; ``remover`` False: the caller
        starts it later), so that its start-up overlaps the build."""
        scratch = new_scratch(self.tmp, self.name)
        self._scratches.append(scratch)
        if remover:
            self.start_remover()
        return scratch

    def start_remover(self) -> None:
        """Start the detached remover of the version the one being built will replace, if
        there is one that nobody runs on and none was started; :meth:`publish` hands it its
        work (without one, the replaced version is removed there, before it returns)."""
        if self._remover is None and self.marker is not None and not self.users():
            self._remover = detach.spawn()

    def use_pool(self) -> None:
        """Make the fan-out directories of the target's pool; if the staging fails, pool
        entries no bundle links to (those it added) are swept."""
        self._pool = Pool.of_target(self.to)
        self._pool.prepare()

    def users(self) -> list[Holder]:
        """Who may be running on the current version of ``TO/NAME``
        (:mod:`ocistage.stagers.retired`):
        live Slurm jobs and processes holding it, asked once per staging."""
        if self._users is None:
            assert self._claim is not None, "use Staging as a context manager"
            self._users = [lease.holder for lease in retired.users(self._claim)]
        return self._users

    def publish(self, tree: Path, processes: int = 1,
                released: set[str] | None = None) -> bool:
        """Make ``tree`` (in a scratch dir) ``TO/NAME`` by one rename, or an exchange with the
        previous version, which is then retired: kept while :meth:`users` may run on it, else
        handed to a detached remover (:func:`ocistage.stagers.retired.retire_for_removal`; where
        none can be started, removed here in ``processes`` workers). ``released``: pool keys
        only the previous version may have used, whose entries are removed once no bundle links
        them (a remover sweeps the whole pool instead). True if a previous version was
        replaced.

        ``tree`` is made owner-only (:data:`ocistage.cache.privatedirs.PRIVATE_DIR_MODE`), and so
        stays when it is retired: no other user of the host may reach the image's setuid/setgid
        files and file capabilities through it (docs/trust.md). Its ``rootfs/`` keeps the
        image's mode, which a non-root container user needs."""
        os.chmod(tree, PRIVATE_DIR_MODE)
        users = self.users() if os.path.lexists(self.final) else []
        replaced = publish(tree, self.final)
        fsync_dir(self.to)
        if replaced is None:
            return False
        assert self._claim is not None
        remover, self._remover = self._remover, None
        try:
            if users:
                retired.retire(replaced, self._claim, users)
            elif retired.retire_for_removal(replaced, self._claim, remover):
                return True
        except BaseException:
            self._keep(replaced)
            raise
        finally:
            if users and remover is not None:
                remover.cancel()
        if not users:
            remove_in_workers(replaced, processes)  # no remover could be started
        if released:
            Pool.of_target(self.to).release(released)
        return True


def _empty_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not path.is_symlink() and not any(path.iterdir())
    except OSError:
        return False


def finish_removal(final: Path, cache_root: Path) -> None:
    """An unstage or GC of ``final`` cut short (its outer marker says ``removing``, and the
    lease it names is dead, :mod:`ocistage.cache.targetlayout`): finish removing what it left of
    the bundle (an emptied mount point, the image), or, where the tree and its marker are
    still there (it is staged again now), drop the outer marker; and release that lease."""
    bundle = targetlayout.open_staged(final)
    if bundle is None:
        return
    outer = bundle.outer
    lease_id = outer.get("id") if outer is not None and targetlayout.removing(outer) else None
    dead = isinstance(lease_id, str) and not any(
        lease.id == lease_id for lease in live_leases(staged_leases(cache_root, final)))
    if not dead:
        bundle.close()
        return
    if bundle.remnant:
        targetlayout.remove(bundle)  # closes it
    else:
        targetlayout.drop_outer_marker(bundle)
        bundle.close()
    assert isinstance(lease_id, str)
    leases.release(cache_root, lease_id)
