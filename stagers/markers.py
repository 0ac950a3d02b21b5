"""The marker of a staged bundle and the lease that protects it.

``<staged path>/.ocistage-staged.json`` says "ocistage made this": ``{"id": <lease id>,
"source": <bundle or ref>, "created": <unix time>, "method": ..., "format": "dir"|"squashfs",
"image": <file name of the squashfs image beside the path, if any>, "tree": <stat digest of
the source>, "sealed": <identity of a sealed source>, "files": <count>}``. ``ocistage unstage`` and
``cache gc`` remove nothing without it. Every staging takes a lease
``staged:<absolute path>`` in the cache (see :mod:`ocistage.cache.leases`) for its holder,
keyed by the place as well (:class:`ocistage.cache.leases.StagedPlace`): a job that staged
``~/x/app`` and one that stages ``/gpfs/home/u/x/app`` (a symlink, a bind mount) hold one
bundle, and :func:`staged_leases` finds the leases of both.

Default holder: inside a Slurm job the job (``$SLURM_JOB_ID``), so the bundle may be collected
once the job has ended; otherwise a pin named ``stage:<user>``, which lives until
``ocistage unstage`` (a pid lease would die with the command that staged).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ocistage.cache import leases, usage
from ocistage.cache.dirfds import DIR_FOLLOW, DIR_READ
from ocistage.cache.dirtrust import trust_problem
from ocistage.cache.leases import Holder, Lease, StagedPlace
from ocistage.cache.targetlayout import image_name, outer_marker_name, read_json_at
from ocistage.stagers.filemanifest import MARKER_NAME


@dataclass(frozen=True)
class Marker:
    id: str
    source: str
    created: float
    method: str = ""
    format: str = "dir"
    image: str | None = None
    tree: str = ""       # stat digest of the source tree staged (filemanifest.stat_digest)
    sealed: str = ""     # identity of a sealed source (ocistage.stagers.target.source_identity)
    files: int = 0       # regular files staged

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {"id": self.id, "source": self.source, "created": self.created,
                               "method": self.method, "format": self.format}
        if self.image is not None:
            doc["image"] = self.image
        if self.tree:
            doc["tree"] = self.tree
        if self.sealed:
            doc["sealed"] = self.sealed
        doc["files"] = self.files
        return json.dumps(doc, indent=2).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> Marker:
        return cls.from_doc(json.loads(data))

    @classmethod
    def from_doc(cls, doc: object) -> Marker:
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str) or not doc["id"]:
            raise ValueError("not an ocistage marker")
        image = doc.get("image")
        if image is not None and image_name(doc) is None:
            raise ValueError("bad image name in marker")
        return cls(id=doc["id"], source=str(doc.get("source", "")),
                   created=float(doc.get("created", 0)), method=str(doc.get("method", "")),
                   format=str(doc.get("format", "dir")), image=image,
                   tree=str(doc.get("tree", "")), sealed=str(doc.get("sealed", "")),
                   files=int(doc.get("files", 0)))


def marker_of(doc: dict[str, object] | None) -> Marker | None:
    """The marker a JSON document read from a marker file holds; None if it holds none."""
    if doc is None:
        return None
    try:
        return Marker.from_doc(doc)
    except (ValueError, TypeError):
        return None


def read_marker(path: Path) -> Marker | None:
    """The marker of what is staged at ``path``; None if nothing of ours is there (a symlink
    at ``path`` is not followed; a directory of another user, or one others can write, holds
    no marker we trust)."""
    try:
        fd = os.open(path, DIR_READ)
    except OSError:
        return None
    try:
        if trust_problem(os.fstat(fd)) is not None:
            return None
        return marker_of(read_json_at(fd, MARKER_NAME))
    finally:
        os.close(fd)


def default_holder(pin: str | None = None,
                   environ: Mapping[str, str] | None = None) -> Holder:
    """``--pin NAME`` if given, else the Slurm job we run in, else the pin ``stage:<user>``."""
    env = os.environ if environ is None else environ
    if pin:
        return Holder.pin(pin)
    job = env.get("SLURM_JOB_ID")
    if job:
        return Holder.slurm_job(job)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return Holder.pin(f"stage:{user}")


def releasing_holder(pin: str | None = None,
                     environ: Mapping[str, str] | None = None) -> Holder | None:
    """Whose leases ``unstage`` releases: ``--pin NAME``, else the Slurm job we run in, else
    None (every holder's)."""
    env = os.environ if environ is None else environ
    if pin:
        return Holder.pin(pin)
    job = env.get("SLURM_JOB_ID")
    return Holder.slurm_job(job) if job else None


def release_leases(cache_root: Path, path: Path, holder: Holder | None,
                   keep: str = "") -> list[Lease]:
    """Release ``holder``'s leases on staged ``path`` (every lease when ``holder`` is None)
    but lease ``keep``; returns the others, live or not."""
    remaining = []
    for lease in staged_leases(cache_root, path):
        if lease.id == keep:
            continue
        if holder is None or same_holder(lease.holder, holder):
            leases.release(cache_root, lease.id)
        else:
            remaining.append(lease)
    return remaining


def live_leases(found: list[Lease]) -> list[Lease]:
    """The leases among ``found`` that are live (Slurm jobs asked with one ``squeue``)."""
    states = leases.job_states_of(found)
    return [lease for lease in found if leases.is_live(lease, states)]


def write_at(dir_fd: int, name: str, data: bytes) -> None:
    """Replace file ``name`` in ``dir_fd`` atomically (temp file, rename; no link followed)."""
    temp = f".{name}.{os.getpid()}.tmp"
    out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(out, "wb") as file:
            file.write(data)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def same_holder(a: Holder, b: Holder) -> bool:
    if a.kind != b.kind:
        return False
    if a.kind == "slurm-job":
        return a.job_id == b.job_id
    if a.kind == "pin":
        return a.name == b.name
    return (a.host, a.pid, a.start) == (b.host, b.pid, b.start)


def staged_target(path: Path) -> str:
    """The lease target of staged ``path`` as spelled (leases on it: :func:`staged_leases`)."""
    return StagedPlace.of(path).target


def staged_leases(cache_root: Path, path: Path) -> list[Lease]:
    """The leases on staged ``path``, through whatever spelling of it they were taken."""
    return leases.leases_on_place(cache_root, StagedPlace.of(path))


def hold(cache_root: Path, path: Path, holder: Holder) -> Lease:
    """This holder's lease on staged ``path``: an existing one is reused, else one is taken."""
    return claim(cache_root, path, holder).lease


@dataclass(frozen=True)
class Claim:
    """A holder's lease on a staged path, as :func:`claim` got it: what every later step of
    the staging that asks about the path's holders (:func:`release_if_unused`,
    :func:`ocistage.stagers.retired.users`, :func:`ocistage.stagers.retired.retire`) needs."""

    cache_root: Path     # the cache the leases are kept in
    path: Path           # the staged path, TO/NAME
    lease: Lease
    taken: bool          # taken now: released again if nothing naming it is published
    local: bool = False  # a node-local copy: leases on it record this node


def claim(cache_root: Path, path: Path, holder: Holder, *, local: bool = False) -> Claim:
    """Hold staged ``path`` (see :func:`hold`; a lease of the holder is reused only if its
    path leads to ``path``), then wait until no ``cache gc`` runs. ``local``: ``path`` is
    this node's own copy (``stage --all-nodes``), and a lease taken records the node
    (:class:`ocistage.cache.leases.StagedPlace`).

    Call it *before* looking at what is staged at ``path``: a GC that started earlier may be
    removing it (all its other leases dead); once it has finished, either it saw this lease or
    the path is gone. The claim says whether the lease was taken now (release it if staging
    fails before anything was published).
    """
    place = StagedPlace.of(path, local=local)
    for lease in leases.leases_on_place(cache_root, place):
        # only a lease whose path reaches ``path``: the marker will name it, and GC removes
        # through the paths of a bundle's leases (one spelled by a directory removed since
        # could never reach this one); and one recording this node if the copy is local
        if (same_holder(lease.holder, holder) and place.reached_by(lease)
                and bool(lease.node) == local):
            leases.wait_for_gc(cache_root)
            return Claim(cache_root, path, lease, taken=False, local=local)
    lease = place.acquire(cache_root, holder)
    leases.wait_for_gc(cache_root)
    return Claim(cache_root, path, lease, taken=True, local=local)


def is_node_local(cache_root: Path, path: Path) -> bool:
    """Whether staged ``path`` is this node's own copy: a lease on it records this node."""
    place = StagedPlace.of(path)
    return any(lease.node == place.here for lease in leases.leases_on_place(cache_root, place))


def release_if_unused(claim: Claim) -> None:
    """After a failed staging: drop the claim's lease if :func:`claim` took it for this
    staging and what is staged at its path (if anything) is not marked with it, by its own
    marker or by the outer marker beside it
    (:func:`ocistage.cache.targetlayout.outer_marker_name`)."""
    if not claim.taken:
        return
    path, lease = claim.path, claim.lease
    marker = read_marker(path)
    if marker is not None and marker.id == lease.id:
        return
    outer = marker_of(_read_beside(path, outer_marker_name(path.name)))
    if outer is not None and outer.id == lease.id:
        return
    leases.release(claim.cache_root, lease.id)


def _read_beside(path: Path, name: str) -> dict[str, object] | None:
    try:
        fd = os.open(path.parent, DIR_FOLLOW)
    except OSError:
        return None
    try:
        return read_json_at(fd, name)
    finally:
        os.close(fd)


def record_bundle_use(source: Path, cache_root: Path) -> None:
    """Record a use of ``source`` if it is a bundle in the cache (``CACHE/bundles/<key>``), so
    ``cache gc`` evicts it last among bundles; best effort."""
    try:
        real = Path(os.path.realpath(source))
        if real.parent != Path(os.path.realpath(cache_root / "bundles")):
            return
        usage.touch(cache_root, "bundle", real.name)
    except (OSError, ValueError):
        return


def new_marker(lease: Lease, source: str, method: str, format: str = "dir",
               image: str | None = None, *, tree: str = "", sealed: str = "",
               files: int = 0) -> Marker:
    return Marker(id=lease.id, source=source, created=time.time(), method=method,
                  format=format, image=image, tree=tree, sealed=sealed, files=files)
