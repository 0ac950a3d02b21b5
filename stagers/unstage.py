"""``unstage``: remove a staged bundle safely and drop its lease.

Only a directory carrying an ocistage marker (``.ocistage-staged.json``) is removed. The path's
last component is opened with ``O_NOFOLLOW``: a symlink there is refused, never followed, and
the removal itself works through directory descriptors (:mod:`cache.fsremove`), so a symlink
swapped in at any level while it runs cannot redirect it outside the bundle. A squashfs mount is
unmounted first and its image (named in the marker, beside the path) removed.

Leases: with a ``holder`` (the CLI passes the Slurm job inside a job, or ``--pin``), only that
holder's leases on the path are released, and the bundle is kept while another live lease still
uses it (another job sharing the same copy); ``force`` removes it anyway. Without a holder, every
lease on the path is released. Pool entries no other bundle links to any more are removed.
"""

from __future__ import annotations

import os
from pathlib import Path

from cache import leases, staged
from cache.leases import Holder
from stagers.filemanifest import StageError
from stagers.markers import read_marker_at, same_holder, staged_target

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _release_leases(cache_root: Path, path: Path, holder: Holder | None) -> bool:
    """Release this holder's (or every) lease on ``path``; True if other live leases remain."""
    target = staged_target(path)
    remaining = []
    for lease in leases.leases_on(cache_root, target):
        if holder is None or same_holder(lease.holder, holder):
            leases.release(cache_root, lease.id)
        else:
            remaining.append(lease)
    if not remaining:
        return False
    jobs = [str(lease.holder.job_id) for lease in remaining if lease.holder.kind == "slurm-job"]
    states = leases.squeue_states(jobs) if jobs else {}
    return any(leases.is_live(lease, states) for lease in remaining)


def unstage(path: Path, *, cache_root: Path, holder: Holder | None = None,
            force: bool = False) -> bool:
    """Remove the staged bundle at ``path``; True if it was removed, False if it was absent or
    is kept for another live lease (see the module docstring)."""
    path = Path(os.path.abspath(path))
    parent, name = os.path.split(path)
    try:
        parent_fd = os.open(parent, _DIR)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            _release_leases(cache_root, path, holder)
            return False
        raise StageError(f"cannot open {parent}: {exc.strerror}") from exc
    try:
        return _unstage_in(parent_fd, Path(parent), name, path, cache_root, holder, force)
    except OSError as exc:
        raise StageError(f"removing {path} failed: {exc.strerror} ({exc.filename})",
                         "check that you own the staged bundle") from exc
    finally:
        os.close(parent_fd)


def _unstage_in(parent_fd: int, parent: Path, name: str, path: Path, cache_root: Path,
                holder: Holder | None, force: bool) -> bool:
    try:
        fd = os.open(name, _DIR, dir_fd=parent_fd)
    except FileNotFoundError:
        _release_leases(cache_root, path, holder)
        return False
    except OSError as exc:
        raise StageError(f"{path} is not a staged bundle (not a directory, or a symlink)",
                         "give the path ocistage stage printed") from exc
    try:
        marker = read_marker_at(fd)
        document = staged.read_json_at(fd, staged.MARKER_NAME)
        if marker is None or document is None:
            raise StageError(f"{path} was not staged by ocistage (no marker); not removing it",
                             "remove it yourself if it is yours")
        in_use = _release_leases(cache_root, path, holder)
        if in_use and not force:
            return False
        mounted = os.fstat(fd).st_dev != os.fstat(parent_fd).st_dev
        bundle = staged.StagedBundle(parent_fd, parent, name, fd, document, None, mounted)
    except BaseException:
        os.close(fd)
        raise
    staged.take_down(bundle)   # closes fd
    staged.remove_beside(bundle)
    return True
