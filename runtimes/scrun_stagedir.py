"""Decides and makes the directory of a job user's bundles under scrun.lua's STAGE_DIR.

STAGE_DIR is shared by every user of the node, so who makes it first must not decide for the
others (docs/trust.md, "STAGE_DIR"); each directory is made and checked here, once, through
:func:`ocistage.cache.ancestors.walk_trusted`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ocistage.cache.ancestors import PARENT_MODE, check_path_trusted, walk_trusted
from ocistage.cache.dirtrust import sticky_of_ours, trust_problem
from ocistage.cache.errors import UntrustedPath
from ocistage.runtimes.errors import ScrunError


def bundle_dir(stage_dir: Path, uid: int, container_id: str) -> Path:
    """The directory of the bundle ``container_id`` (a checked name, no ``/``) of ``uid``:
    ``STAGE_DIR/<uid>/<id>`` or ``STAGE_DIR-<uid>/<id>`` (:func:`user_stage_dir`), made if
    needed and checked to be a private directory of the caller (:func:`private_dir`)."""
    return private_dir(user_stage_dir(stage_dir, uid) / container_id)


def user_stage_dir(stage_dir: Path, uid: int) -> Path:
    """The directory of ``uid``'s bundles, made if needed (:func:`private_dir`).

    STAGE_DIR is shared by every user of the node (``/tmp/ocistage-scrun``), so who makes it
    first must not decide for the others (docs/trust.md, "STAGE_DIR"): root makes it root's
    and sticky (1777, like ``/tmp``); every user's bundles go to ``STAGE_DIR/<uid>`` when it
    is such a directory, or the caller's own, or root's holding ``<uid>`` already. Anybody
    else's STAGE_DIR (a co-tenant who made it first, 0755 or 0777), or none when the caller
    is not root, is never used: the bundles go to ``STAGE_DIR-<uid>`` beside it instead.
    """
    if os.geteuid() == 0:
        _make_shared_stage_dir(stage_dir)
    if _holds_user_dirs(stage_dir, uid):
        return private_dir(stage_dir / str(uid))
    return private_dir(stage_dir.with_name(f"{stage_dir.name}-{uid}"))


def _make_shared_stage_dir(stage_dir: Path) -> None:
    """Root only: a missing STAGE_DIR made root's and sticky, as ``/tmp`` (its parent checked
    first, :func:`check_path_trusted`); an existing one is left as it is."""
    if os.path.lexists(stage_dir):
        return
    check_path_trusted(stage_dir.parent, "scrun stage directory", make=PARENT_MODE,
                       shared=True)
    try:
        os.mkdir(stage_dir, 0o700)
    except FileExistsError:
        return  # made meanwhile: judged by _holds_user_dirs like any existing one
    except OSError as exc:
        raise ScrunError(f"cannot create {stage_dir}: {exc.strerror}") from exc
    os.chmod(stage_dir, 0o1777)  # in a checked parent: nobody but root can swap it


def _holds_user_dirs(stage_dir: Path, uid: int) -> bool:
    """Whether ``STAGE_DIR/<uid>`` is where the caller's bundles go: STAGE_DIR (every
    directory above it checked) is root's sticky one, or the caller's own, or root's already
    holding ``<uid>`` (a site that made the users' directories)."""
    try:
        st = walk_trusted(stage_dir, "scrun stage directory")
    except (FileNotFoundError, UntrustedPath):
        return False  # anything wrong above STAGE_DIR is found again beside it
    except OSError as exc:
        raise ScrunError(f"cannot examine {stage_dir}: {exc.strerror}") from exc
    if sticky_of_ours(st) and st.st_uid == 0:
        return True
    if trust_problem(st) is not None:
        return False
    return st.st_uid == os.geteuid() or os.path.lexists(stage_dir / str(uid))


def private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) if needed and make sure it is a directory of ours.

    Every directory above it is checked (:func:`ocistage.cache.ancestors.walk_trusted`): in a
    sticky STAGE_DIR (or ``/tmp``) another user could have made ``path`` first (or a symlink
    there) to receive or swap our files, and in a directory another user can write they could
    swap it after we made it.
    """
    try:
        st = walk_trusted(path, "scrun stage directory", make=0o700, follow=False)
    except OSError as exc:
        raise ScrunError(f"cannot create {path}: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise ScrunError(f"{path} is not a private directory of uid {os.getuid()}",
                         "remove it (someone else made it) or choose another --stage-dir")
    return path
