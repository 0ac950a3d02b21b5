"""Stages an engine's bundle for Slurm and removes it again: ``ocistage scrun stage-in/out``.

Slurm's ``scrun`` (the OCI runtime that rootless Docker/Podman call) hands the hooks in
``/etc/slurm/scrun.lua`` (:mod:`ocistage.runtimes.scrun_lua` renders it) the bundle the engine
made: a ``config.json`` whose ``root.path`` points at the engine's rootfs. The generated Lua
calls ``ocistage scrun stage-in``, which resolves the request once, before anything is staged
(:func:`_place`), then

1. stages that rootfs content-addressed (``ocistage.stagers.directory.stage_tree``: unchanged
   files are not copied again) to ``STAGE_DIR/<uid>/<id>/rootfs`` (or ``STAGE_DIR-<uid>/<id>``
   when STAGE_DIR is not one every user can trust: :mod:`ocistage.runtimes.scrun_stagedir`),
   leased to the Slurm job;
2. writes ``<id>/config.json`` beside it, rewritten for Slurm
   (:mod:`ocistage.runtimes.scrun_config`): ``root.path`` is the staged rootfs, the user
   namespace maps the container user to the job user, the job environment is merged, and what
   cannot work on a compute node is dropped (``cgroupsPath``, resources, prestart hooks, a
   network namespace, bind mounts of missing sources);
3. prints one JSON line that the Lua reads back (cjson) to call ``slurm.set_bundle_path`` and
   ``slurm.set_root_path``.

``stage-out`` removes both again, but only a bundle that stage-in made (it carries a marker).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ocistage.cache.atomicwrite import write_file_atomic
from ocistage.cache.errors import ForeignFile
from ocistage.cache.leases import Holder
from ocistage.cache.readback import read_own
from ocistage.cache.treeremoval import remove_tree
from ocistage.cache.userdirs import host_id, host_root_mapped
from ocistage.errors import OcistageError, UsageError
from ocistage.runtimes.errors import ScrunError
from ocistage.runtimes.scrun_config import (
    MAX_CONFIG_BYTES,
    read_config,
    rewrite_config,
    source_rootfs,
)
from ocistage.runtimes.scrun_lua import StageTo
from ocistage.runtimes.scrun_stagedir import bundle_dir

MARKER = ".ocistage-scrun.json"
ROOTFS = "rootfs"  # the staged rootfs: BUNDLE/rootfs
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")


# -- stage-in ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageInRequest:
    container_id: str
    bundle: Path                      # the bundle Docker/Podman made
    config_file: Path                 # its config.json (scrun passes it separately)
    stage_dir: Path                   # STAGE_DIR: bundles go to STAGE_DIR/<uid>/ (user_stage_dir)
    job_id: str | None = None
    uid: int | None = None            # the job user (as scrun sees it); None: the caller
    gid: int | None = None
    job_env: Sequence[str] = ()
    link: bool = False                # share inodes (hardlink/pool) and mount the root read-only
    # the sbatch that queues the cleanup job (runtimes/scrun_cleanup.py); None: no cleanup job
    sbatch: str | None = None
    stage_to: StageTo = "shared"
    node: str | None = None           # node-local staging: the node holding the bundle


@dataclass(frozen=True)
class StageInResult:
    bundle: Path
    root_path: Path
    config: Path
    files: int
    copied: int
    linked: int
    unchanged: int
    bytes_copied: int
    lease_id: str | None
    method: str
    dropped: tuple[str, ...]
    cleanup_job_id: str | None = None
    cleanup_error: str | None = None     # why no cleanup job could be queued

    def to_json(self) -> dict[str, Any]:
        return {"bundle": str(self.bundle), "root_path": str(self.root_path),
                "config": str(self.config), "files": self.files, "copied": self.copied,
                "linked": self.linked, "unchanged": self.unchanged,
                "bytes_copied": self.bytes_copied, "lease_id": self.lease_id,
                "method": self.method, "dropped": list(self.dropped),
                "cleanup_job_id": self.cleanup_job_id, "cleanup_error": self.cleanup_error}


@dataclass(frozen=True)
class StagedOut:
    """What ``ocistage scrun stage-out`` reports: the bundle, scrun's root path, and whether
    :func:`stage_out` removed it."""

    bundle: Path
    root_path: str | None
    removed: bool

    def to_json(self) -> dict[str, Any]:
        return {"bundle": str(self.bundle), "root_path": self.root_path,
                "removed": self.removed}


def job_ids(uid: int | None, gid: int | None) -> tuple[int, int]:
    """The job user's ids for stage-in: the hooks run as the job user, so an unprivileged
    caller stages for itself, with its ids as the host sees them. scrun passes the ids it
    sees: in rootless Podman's user namespace (where scrun runs) the user is 0, which would
    map container root to the host's root. Root (outside any namespace) stages for the
    ids given (default: its own).

    An unprivileged caller's ``uid``/``gid`` must name itself (:func:`own_ids`); another
    user's is refused (UsageError) before anything is staged, never silently replaced."""
    real_uid = host_id("uid", os.getuid())
    if real_uid != 0:
        for kind, given, here in (("uid", uid, os.getuid()), ("gid", gid, os.getgid())):
            if given is not None and given not in own_ids(kind, here):
                raise UsageError(
                    f"--{kind} {given} is not yours: as {kind} {host_id(kind, here)}, "
                    f"stage-in stages for you only",
                    f"give your own {kind} ({', '.join(map(str, sorted(own_ids(kind, here))))}"
                    f") or none; only root stages for other users")
        return real_uid, host_id("gid", os.getgid())
    return (os.getuid() if uid is None else uid, os.getgid() if gid is None else gid)


def own_ids(kind: str, here: int) -> set[int]:
    """The ``--uid``/``--gid`` values that name an unprivileged caller (``here``: its id in
    this process's user namespace): that id, the host's id for it (``/proc/self/uid_map``),
    and 0, what rootless Podman's and Docker's user namespace maps the caller to (scrun runs
    there and passes that id, also to a ``node-local`` stage-in run outside it)."""
    return {here, host_id(kind, here), 0}


def check_container_id(container_id: str) -> str:
    if not _ID_RE.match(container_id) or ".." in container_id:
        raise UsageError(f"invalid container id {container_id!r}",
                         "container ids are letters, digits and _.+- (no slashes)")
    return container_id


def _marker_path(bundle: Path) -> Path:
    return bundle / MARKER


@dataclass(frozen=True)
class _Placement:
    """A request resolved once, before anything is staged: what goes where, for whom, and
    the config.json that goes beside it."""

    rootfs: Path                 # the engine's rootfs: what is staged
    bundle: Path                 # STAGE_DIR/<uid>/<id>, made and checked (scrun_stagedir)
    holder: Holder               # the lease's holder: the Slurm job, or this process
    config: dict[str, Any]       # the engine's config rewritten for Slurm
    dropped: tuple[str, ...]     # what the rewrite dropped or changed


def _place(request: StageInRequest) -> _Placement:
    """Check ``request`` and resolve it (see :class:`_Placement`)."""
    container_id = check_container_id(request.container_id)
    uid, gid = job_ids(request.uid, request.gid)  # an unprivileged caller's own, or refused
    if not host_root_mapped():
        raise ScrunError(
            "stage-in runs in a user namespace without the host's root (rootless Podman's, "
            "where scrun runs the allocator's commands): root's directories show as nobody "
            "there, so no directory can be trusted",
            "generate scrun.lua with `--stage-to node-local`: its hooks run through srun, "
            "outside the engine's namespace (docs/slurm.md, \"Rootless Podman\")")
    engine_config = read_config(request.config_file)
    rootfs = source_rootfs(request.bundle, engine_config)
    # made and checked once (every directory above it the caller's or root's): nobody but the
    # caller and root can swap what slurmstepd runs. The rootfs goes to BUNDLE/rootfs:
    # slurmstepd 22.05 runs <bundle>/rootfs whatever root.path says (and the stager's pool
    # and scratch dirs then live inside the bundle)
    bundle = bundle_dir(request.stage_dir, uid, container_id)
    config, dropped = rewrite_config(engine_config, root_path=bundle / ROOTFS, uid=uid,
                                     gid=gid, job_env=request.job_env)
    holder = Holder.slurm_job(request.job_id) if request.job_id else Holder.this_process()
    return _Placement(rootfs, bundle, holder, config, tuple(dropped))


def stage_in(request: StageInRequest, *, cache_root: Path, jobs: int = 8) -> StageInResult:
    """Stage the engine's bundle for Slurm (see the module docstring)."""
    from ocistage.stagers.directory import stage_tree  # imported late: a sibling package's API

    place = _place(request)
    # link=False: the container gets its own writable files (a shared inode would let it
    # write through into the engine's rootfs or other bundles); link=True shares them, and
    # the root is then mounted read-only
    staged = stage_tree(place.rootfs, place.bundle, cache_root=cache_root, name=ROOTFS,
                        holder=place.holder, link=None if request.link else False, jobs=jobs)
    root_path = Path(staged.path)
    if staged.method != "copy":
        place.config["root"]["readonly"] = True
    cleanup_id, cleanup_error = _queue_cleanup(request, place.bundle, cache_root)
    write_file_atomic(_marker_path(place.bundle), json.dumps(
        {"root_path": str(root_path), "lease_id": staged.lease_id,
         "job_id": request.job_id, "cleanup_job_id": cleanup_id,
         "sbatch": request.sbatch}).encode(), mode=0o600)
    config_path = place.bundle / "config.json"
    write_file_atomic(config_path, json.dumps(place.config, indent=2).encode(), mode=0o644)
    return StageInResult(bundle=place.bundle, root_path=root_path, config=config_path,
                         files=staged.files, copied=staged.copied, linked=staged.linked,
                         unchanged=staged.unchanged, bytes_copied=staged.bytes_copied,
                         lease_id=staged.lease_id, method=staged.method,
                         dropped=place.dropped, cleanup_job_id=cleanup_id,
                         cleanup_error=cleanup_error)


def _queue_cleanup(request: StageInRequest, bundle: Path,
                   cache_root: Path) -> tuple[str | None, str | None]:
    """The cleanup job's id, or why there is none (runtimes/scrun_cleanup.py)."""
    from ocistage.runtimes.scrun_cleanup import queue_cleanup

    if request.sbatch is None or not request.job_id:
        return None, None
    if request.stage_to == "node-local" and not request.node:
        return None, "node-local staging outside a Slurm step (no SLURMD_NODENAME)"
    try:
        return queue_cleanup(bundle, job_id=request.job_id, cache_root=cache_root,
                             sbatch_program=request.sbatch, node=request.node), None
    except OcistageError as exc:
        return None, exc.message


# -- stage-out ---------------------------------------------------------------------------------


def stage_out(bundle: Path, *, cache_root: Path) -> bool:
    """Remove a bundle that :func:`stage_in` made, with its staged rootfs and lease.

    Refuses a directory without stage-in's marker (scrun may pass the engine's own bundle if
    stage-in failed). Returns False when the bundle is gone already.
    """
    from ocistage.stagers.unstage import unstage  # imported late: a sibling package's API

    bundle = bundle.absolute()
    marker = _marker_path(bundle)
    if not bundle.exists():
        return False
    try:
        record = json.loads(read_own(marker, MAX_CONFIG_BYTES))  # never a FIFO, never theirs
        root_path = Path(record["root_path"])
    except FileNotFoundError as exc:
        raise ScrunError(f"{bundle} was not staged by `ocistage scrun stage-in`; "
                         "not removing it") from exc
    except (OSError, ValueError, KeyError, TypeError, ForeignFile) as exc:
        raise ScrunError(f"unreadable stage-in marker {marker}: {exc}") from exc
    if root_path != bundle / ROOTFS:
        raise ScrunError(f"stage-in marker of {bundle} names {root_path}, not the rootfs "
                         "inside its bundle (outside its bundle); not removing it")
    job_id = record.get("job_id")
    holder = Holder.slurm_job(job_id) if isinstance(job_id, str) and job_id else None
    unstage(root_path, cache_root=cache_root, holder=holder)
    remove_tree(bundle)
    cleanup_id, sbatch = record.get("cleanup_job_id"), record.get("sbatch")
    if isinstance(cleanup_id, str) and cleanup_id.isdigit() and isinstance(sbatch, str):
        from ocistage.runtimes.scrun_cleanup import cancel_cleanup

        cancel_cleanup(cleanup_id, sbatch_program=sbatch)  # not needed any more
    return True
