"""``unstage``: remove a staged bundle safely and drop its lease.

Only a directory carrying an ocistage marker (``.ocistage-staged.json``) is removed. The path's
last component is opened with ``O_NOFOLLOW`` (the target holding it may be reached through a
symlink the user chose, as with ``stage --to``): a symlink there is refused, never followed, and
the removal itself works through directory descriptors (:mod:`ocistage.cache.fsops`), so a symlink
swapped in at any level while it runs cannot redirect it outside the bundle. A squashfs mount is
unmounted first and its image (named in the marker, beside the path) removed.

Leases: with a ``holder`` (the CLI passes the Slurm job inside a job, or ``--pin``), only that
holder's leases on the path are released, and the bundle is kept while another live lease still
uses it (another job sharing the same copy); ``force`` removes it anyway. Without a holder, every
lease on the path is released. Pool entries no other bundle links to any more are removed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.cache import staged
from ocistage.cache.fsops import DIR_FOLLOW, DIR_READ
from ocistage.cache.leases import Holder, Lease
from ocistage.stagers import retired
from ocistage.stagers.errors import StageError
from ocistage.stagers.markers import (
    Marker,
    live_leases,
    marker_of,
    release_leases,
    same_holder,
    staged_leases,
    write_at,
)

if TYPE_CHECKING:
    from ocistage.cache.results import Renderer


def _release_leases(cache_root: Path, path: Path, holder: Holder | None) -> list[Lease]:
    """Release this holder's (or every) lease on ``path``; returns the live leases left."""
    return live_leases(release_leases(cache_root, path, holder))


def _hand_over(parent_fd: int, name: str, fd: int, marker: Marker, mounted: bool,
               live: list[Lease]) -> None:
    """Make the marker name a lease that stays, if the one it named was just released.

    ``cache gc`` removes a staged bundle only when its marker names one of its dead leases;
    a marker naming a released lease would keep the bundle forever once the remaining
    holders are gone. A mounted image is read-only: its outer marker is written instead.
    """
    if marker.id in {lease.id for lease in live}:
        return
    data = replace(marker, id=live[0].id).to_json()
    if mounted:
        write_at(parent_fd, staged.outer_marker_name(name), data)
    else:
        write_at(fd, staged.MARKER_NAME, data)


@dataclass(frozen=True)
class Unstaged:
    """What ``ocistage unstage`` reports: the path it was given, and :func:`unstage`'s answer."""

    path: Path
    removed: bool
    absent: bool = False  # nothing was there: only a lease on it was released, if ``leased``
    leased: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path.absolute()), "removed": self.removed}

    def render(self, out: Renderer) -> None:
        if self.removed:
            out.note(f"removed {self.path}")
        elif self.absent and self.leased:
            out.note(f"released the lease on {self.path} (already removed)")
        elif self.absent:
            out.note(f"nothing was staged at {self.path}")
        else:
            out.note(f"kept {self.path}: other jobs or pins still hold it (--force removes it)")


def holds_lease(cache_root: Path, path: Path, holder: Holder | None) -> bool:
    """Whether ``holder`` (anybody, if None) holds a lease on staged ``path``."""
    return any(holder is None or same_holder(lease.holder, holder)
               for lease in staged_leases(cache_root, Path(os.path.abspath(path))))


def unstage(path: Path, *, cache_root: Path, holder: Holder | None = None,
            force: bool = False) -> bool:
    """Remove the staged bundle at ``path``; True if it was removed, False if it was absent or
    is kept for another live lease (see the module docstring)."""
    path = Path(os.path.abspath(path))
    parent, name = os.path.split(path)
    try:
        parent_fd = os.open(parent, DIR_FOLLOW)  # the target, reached as the user spells it
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            _release_leases(cache_root, path, holder)
            return False
        raise StageError(f"cannot open {parent}: {exc.strerror}") from exc
    try:
        removed = _unstage_in(parent_fd, Path(parent), name, path, cache_root, holder, force)
        # versions of it that a re-stage retired while jobs ran on them (ocistage.stagers.retired)
        retired.sweep(Path(parent), name, cache_root, holder=holder, release=True, force=force)
    except OSError as exc:
        raise StageError(f"removing {path} failed: {exc.strerror} ({exc.filename})",
                         "check that you own the staged bundle") from exc
    finally:
        os.close(parent_fd)
    return removed


def _unstage_in(parent_fd: int, parent: Path, name: str, path: Path, cache_root: Path,
                holder: Holder | None, force: bool) -> bool:
    try:
        fd = os.open(name, DIR_READ, dir_fd=parent_fd)
    except FileNotFoundError:
        _release_leases(cache_root, path, holder)
        return False
    except OSError as exc:
        raise StageError(f"{path} is not a staged bundle (not a directory, or a symlink)",
                         "give the path ocistage stage printed") from exc
    try:
        document = staged.read_json_at(fd, staged.MARKER_NAME)  # read once: both views
        marker = marker_of(document)
        if marker is None or document is None:
            raise StageError(f"{path} was not staged by ocistage (no marker); not removing it",
                             "remove it yourself if it is yours")
        live = _release_leases(cache_root, path, holder)
        mounted = os.fstat(fd).st_dev != os.fstat(parent_fd).st_dev
        if live and not force:
            _hand_over(parent_fd, name, fd, marker, mounted, live)
            os.close(fd)
            return False
        bundle = staged.StagedBundle(parent_fd, parent, name, fd, document, None, mounted)
    except BaseException:
        os.close(fd)
        raise
    staged.take_down(bundle)   # closes fd
    staged.remove_beside(bundle)
    return True
