"""Leases: "this content is in use, do not collect it".

A lease names a *target* and a *holder*. Targets are strings with a kind prefix:

    image:<ref name>          an image in index.json (its manifest, config and layers)
    bundle:<key>              a bundle under CACHE/bundles/<key>
    blob:sha256:<hex>         one blob
    snapshot:sha256:<hex>     one unpacked layer snapshot (by diff_id)
    staged:<absolute path>    a bundle staged outside the cache (see stagers/)
    squashfs:<key>            a squashfs image of ocistage-pyxis-importer (CACHE/pyxis/<key>.sqsh)

A lease may name more targets in ``also`` (one file for everything a command uses, see
:class:`InUse`).

A staged path has many spellings: ``~/x`` and ``/gpfs/home/u/x``, a symlink, a bind mount
of the target. A lease on one is therefore also keyed by the *place* (:class:`StagedPlace`):
its ``identity`` is ``<st_dev>:<st_ino>:<handle>/<NAME>`` of the directory holding ``NAME``,
the same through every symlink and bind mount on a node. ``<handle>`` is the directory's file
handle (``name_to_handle_at(2)``, what NFS servers hand out: the inode number and its
*generation*), so a directory removed and made again is another place even where it gets the
old inode number, as ext4 gives it at once: a lease on the old one can never stand for the
new one (a job that staged into the old one and stages again into the new one takes a new
lease there, which GC removes the new version through). A filesystem without file handles
records ``<st_dev>:<st_ino>/<NAME>``, the form ocistage wrote before (:func:`same_place`
compares such an identity by ``st_dev:st_ino/NAME`` alone, as it did: leases of a cache
made by an earlier release keep counting). Leases on a place (:func:`leases_on_place`, and
GC's :func:`staged_groups`) are those whose path is the same or whose identity is; a lease
written before identities were recorded (none in its file) is placed by where its path leads
now. Its path stays what humans read (``cache ls``) and what GC removes through; an older
ocistage reads the same file and goes by the path alone. Across nodes the identity of one
shared directory may differ (``st_dev`` is numbered per node): there the path is what
matches.

Holders are a process (``pid`` on a host, with its start time so a reused pid does not count),
a Slurm job (``slurm-job`` with its id; live while ``squeue`` lists it), or a named ``pin``
(live until released). Each lease is one JSON file ``CACHE/leases/<id>.json`` written by
atomic rename, so many nodes can take and drop leases on a shared filesystem without locks.

A lease whose holder is known to be gone is *dead*; ``cache gc`` deletes dead leases and then
everything no live lease or ref protects. A staged bundle's leases are dropped only together,
once all of them are dead (``ocistage.cache.gc`` then removes the staged directory if its marker
names one of them).

Leases and GC race-free: ``cache gc`` holds ``CACHE/gc.lock`` from reading the leases until it
has deleted what it decided to delete. A command that is about to use content first records its
lease, then waits until no GC holds that lock (:func:`wait_for_gc`), and only then looks at the
content: either the GC saw the lease, or it finished before the command looked.

When liveness cannot be decided here (a pid on another host, a job while Slurm's commands are
missing), the lease counts as live: GC errs on the side of keeping data.

A lease on a *node-local* place (``stage --all-nodes``: one path, a copy on each node) records
its ``node`` (:func:`ocistage.cache.nodes.this_node`): it is on that node's copy alone. Seen
from another node it is on no place there (:meth:`StagedPlace.held_by`), and GC groups it with
its node's leases only (:func:`staged_groups`); what GC does with such a group elsewhere is
:mod:`ocistage.cache.leaseexpiry`'s. A lease without a node is on the path wherever it is read.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

from ocistage.cache.atomicwrite import write_file_atomic
from ocistage.cache.errors import ForeignFile, StoreError
from ocistage.cache.jsondoc import parse_json, read_document
from ocistage.cache.locks import Owner, is_foreign, lock_owner, owner_is_dead
from ocistage.cache.nodes import host_name, this_node
from ocistage.cache.readback import open_own, read_capped
from ocistage.errors import UsageError

#: a lease file is a few hundred bytes
MAX_LEASE_BYTES = 64 << 10

HolderKind = Literal["pid", "slurm-job", "pin"]
TARGET_KINDS = ("image", "bundle", "blob", "snapshot", "staged", "squashfs")
GC_LOCK = "gc.lock"
#: Slurm job states in which a job still uses what it leased.
SLURM_ACTIVE_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "RESIZING", "REQUEUED",
    "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
})


@dataclass(frozen=True)
class Holder:
    kind: HolderKind
    host: str = ""
    pid: int | None = None
    start: str | None = None
    job_id: str | None = None
    name: str | None = None

    @classmethod
    def this_process(cls) -> Holder:
        return cls.process(os.getpid())

    @classmethod
    def process(cls, pid: int) -> Holder:
        """Process ``pid`` of this host, by its start time (None if it is gone already)."""
        owner = Owner.of(pid)
        return cls("pid", host=owner.host, pid=owner.pid, start=owner.start)

    @classmethod
    def slurm_job(cls, job_id: str) -> Holder:
        if not job_id or not job_id.replace("_", "").replace("+", "").isdigit():
            raise UsageError(f"invalid Slurm job id {job_id!r}")
        return cls("slurm-job", host=host_name(), job_id=job_id)

    @classmethod
    def pin(cls, name: str) -> Holder:
        if not name:
            raise UsageError("a pin needs a name")
        return cls("pin", host=host_name(), name=name)

    def describe(self) -> str:
        if self.kind == "pid":
            return f"pid {self.pid} on {self.host}"
        if self.kind == "slurm-job":
            return f"job {self.job_id}"
        return f"pin {self.name}"


@dataclass(frozen=True)
class Lease:
    id: str
    target: str
    holder: Holder
    created: float
    also: tuple[str, ...] = field(default=())
    identity: str = ""   # of a staged target: where it is, whatever the spelling (StagedPlace)
    node: str = ""       # of a node-local staged target: the node whose copy it holds

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.target, *self.also)

    def to_json(self) -> str:
        doc = asdict(self)
        for key in ("identity", "node"):
            if not doc[key]:
                del doc[key]
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Lease:
        data = parse_json(text)
        also = data.get("also", [])
        if not isinstance(also, list):
            raise ValueError("'also' must be a list")
        return cls(id=str(data["id"]), target=str(data["target"]),
                   holder=Holder(**data["holder"]), created=float(data["created"]),
                   also=tuple(str(t) for t in also), identity=str(data.get("identity", "")),
                   node=str(data.get("node", "")))


def check_target(target: str) -> str:
    kind, sep, rest = target.partition(":")
    if not sep or kind not in TARGET_KINDS or not rest:
        raise UsageError(f"invalid lease target {target!r}",
                         f"targets look like KIND:VALUE with KIND one of {', '.join(TARGET_KINDS)}")
    if kind == "staged" and not rest.startswith("/"):
        raise UsageError(f"staged lease target needs an absolute path, not {rest!r}")
    return target


def _directory(cache_root: Path) -> Path:
    path = cache_root / "leases"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write(cache_root: Path, lease: Lease) -> None:
    try:
        write_file_atomic(_directory(cache_root) / f"{lease.id}.json", lease.to_json().encode())
    except OSError as exc:
        raise StoreError(f"cannot record a lease in {cache_root}: {exc.strerror}") from exc


def record(cache_root: Path, lease: Lease) -> None:
    """Write ``lease`` as it is (a caller that names its leases itself, to find them again:
    ocistage.bundler.pyxis); an existing lease of that id is replaced."""
    check_target(lease.target)
    if not lease.id or "/" in lease.id or lease.id.startswith("."):
        raise UsageError(f"invalid lease id {lease.id!r}")
    _write(cache_root, lease)


def exists(cache_root: Path, lease_id: str) -> bool:
    """Whether a lease of this id is recorded (a name a caller gave it, see :func:`record`)."""
    return os.path.lexists(cache_root / "leases" / f"{lease_id}.json")


def acquire(cache_root: Path, target: str, holder: Holder, identity: str = "",
            node: str = "") -> Lease:
    """Record a lease on ``target`` for ``holder``; returns it (its id releases it).
    ``identity`` and ``node``: of a staged target, see :class:`StagedPlace`."""
    lease = Lease(id=uuid.uuid4().hex, target=check_target(target), holder=holder,
                  created=time.time(), identity=identity, node=node)
    _write(cache_root, lease)
    return lease


def release(cache_root: Path, lease_id: str) -> bool:
    """Drop a lease; False if it did not exist."""
    if not lease_id or "/" in lease_id or lease_id.startswith("."):
        raise UsageError(f"invalid lease id {lease_id!r}")
    try:
        (cache_root / "leases" / f"{lease_id}.json").unlink()
    except (FileNotFoundError, NotADirectoryError):  # no such lease, or no such cache here
        return False
    return True


def release_named(cache_root: Path, prefix: str) -> int:
    """Drop every lease whose id starts with ``prefix`` (those a caller named with
    :func:`record`); how many. A cache without leases has none to drop."""
    if not prefix or "/" in prefix or prefix.startswith("."):
        raise UsageError(f"invalid lease id prefix {prefix!r}")
    with contextlib.suppress(FileNotFoundError):
        names = [entry.name for entry in os.scandir(cache_root / "leases")]
        return sum(release(cache_root, name.removesuffix(".json")) for name in names
                   if name.startswith(prefix) and name.endswith(".json"))
    return 0


def drop_own_dead(cache_root: Path) -> int:
    """Drop the leases in ``cache_root`` that this user's processes on this host left when they
    were killed (SIGKILL: no handler ran): a ``pid`` holder on this host that is gone, in a
    regular file of the caller's own (never another user's, nor root's for a user); how many.
    Each file is opened once (no symlink followed, no FIFO waited for) and removed only while
    its name still leads to the file read (a lease rewritten since stays)."""
    me, host, dropped = os.geteuid(), host_name(), 0
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, PermissionError):
        with os.scandir(cache_root / "leases") as entries:
            names = [e.name for e in entries if e.name.endswith(".json")
                     and not e.is_symlink() and e.is_file() and e.stat().st_uid == me]
        for name in names:
            path = cache_root / "leases" / name
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError, ForeignFile):
                fd, st = open_own(path)
                try:
                    lease = Lease.from_json(read_capped(fd, MAX_LEASE_BYTES).decode())
                    holder = lease.holder
                    if (st.st_uid != me or holder.kind != "pid" or holder.host != host
                            or holder.pid is None or is_live(lease, None)):
                        continue
                    if os.lstat(path).st_ino == st.st_ino:  # still the file read
                        path.unlink()
                        dropped += 1
                finally:
                    os.close(fd)
    return dropped


def all_leases(cache_root: Path) -> list[Lease]:
    """Every lease, oldest first; unreadable lease files are skipped (a writer may be mid-way)."""
    directory = cache_root / "leases"
    result = []
    with contextlib.suppress(FileNotFoundError):
        for path in directory.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError, ForeignFile):
                # a group-shared cache's members can plant files: no symlink, FIFO or
                # outsider's file is read (ocistage.cache.readback), and the size is capped
                data = read_document(path, MAX_LEASE_BYTES, owners="group")
                result.append(Lease.from_json(data.decode()))
    return sorted(result, key=lambda lease: lease.created)


def leases_on(cache_root: Path, target: str) -> list[Lease]:
    """The leases naming ``target`` as spelled (for a staged path, :func:`leases_on_place`)."""
    return [lease for lease in all_leases(cache_root) if target in lease.targets]


# -- staged places -----------------------------------------------------------------------------

STAGED = "staged:"


def staged_identity(path: str | os.PathLike[str]) -> str:
    """``<st_dev>:<st_ino>:<handle>/<name>`` of the directory holding the (absolute) ``path``,
    reached through any symlinks and mounts (``<st_dev>:<st_ino>/<name>`` where its
    filesystem has no file handles); "" if that directory cannot be examined."""
    parent, name = os.path.split(os.path.abspath(path))
    try:
        fd = os.open(parent or "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        from ocistage.cache.filehandles import file_handle  # ctypes: staging only

        st = os.fstat(fd)
        handle = file_handle(fd)
    except OSError:
        return ""
    finally:
        os.close(fd)
    where = f"{st.st_dev}:{st.st_ino}:{handle}" if handle else f"{st.st_dev}:{st.st_ino}"
    return f"{where}/{name}"


def same_place(a: str, b: str) -> bool:
    """Whether two identities (:func:`staged_identity`) are of one place: equal, or, where
    one records no file handle (a lease of an earlier release, a filesystem without
    handles), of the same ``st_dev:st_ino`` and name."""
    if not a or not b:
        return False
    if a == b:
        return True
    (where_a, name_a), (where_b, name_b) = _split_identity(a), _split_identity(b)
    if name_a != name_b or (len(where_a) > 2 and len(where_b) > 2):
        return False  # two handles that differ: another directory, whatever its inode
    return where_a[:2] == where_b[:2]


def _split_identity(identity: str) -> tuple[list[str], str]:
    where, _, name = identity.partition("/")
    return where.split(":"), name


def _coarse(identity: str) -> str:
    """``st_dev:st_ino/NAME`` of an identity (the form without a file handle)."""
    where, name = _split_identity(identity)
    return f"{':'.join(where[:2])}/{name}"


@dataclass(frozen=True)
class StagedPlace:
    """A staged path as spelled (``path``: humans read it, GC removes through it) and where it
    is (``identity``: :func:`staged_identity`, "" where its directory is gone), seen from node
    ``here``; ``local``: a node-local copy, whose new leases record ``here``."""

    path: Path
    identity: str
    here: str = ""
    local: bool = False

    @classmethod
    def of(cls, path: str | os.PathLike[str], *, local: bool = False) -> StagedPlace:
        absolute = Path(os.path.abspath(path))
        return cls(absolute, staged_identity(absolute), this_node(), local)

    @property
    def target(self) -> str:
        return f"{STAGED}{self.path}"

    def acquire(self, cache_root: Path, holder: Holder) -> Lease:
        """A new lease of ``holder`` on this place (recording this node if it is local)."""
        return acquire(cache_root, self.target, holder, self.identity,
                       self.here if self.local else "")

    def sees(self, lease: Lease) -> bool:
        """Whether ``lease`` may be on a place of this node: it records no node, or this one."""
        return not lease.node or lease.node == self.here

    def held_by(self, lease: Lease) -> bool:
        """Whether ``lease`` is on this place: recorded on no other node (:meth:`sees`), and
        the same path, or the same identity (recorded, :func:`same_place`, or, for a lease
        that records none, where its path leads now)."""
        if not self.sees(lease):
            return False
        if self.target in lease.targets:
            return True
        if not self.identity or not lease.target.startswith(STAGED):
            return False
        if lease.identity:
            return same_place(lease.identity, self.identity)
        return self.reached_by(lease)

    def reached_by(self, lease: Lease) -> bool:
        """Whether ``lease``'s path is this place's, or leads to it now. (A lease on this
        place spelled by a path that leads elsewhere now, or nowhere, still protects it, but
        can not be removed through.)"""
        if not self.sees(lease):
            return False
        if self.target in lease.targets:
            return True
        if not self.identity or not lease.target.startswith(STAGED):
            return False
        path = lease.target.removeprefix(STAGED)
        return (os.path.basename(path) == self.path.name
                and staged_identity(path) == self.identity)


def leases_on_place(cache_root: Path, place: StagedPlace) -> list[Lease]:
    """The leases on the staged ``place``, whatever path they spell it with."""
    return [lease for lease in all_leases(cache_root) if place.held_by(lease)]


def staged_groups(found: Iterable[Lease], here: str | None = None) -> list[list[Lease]]:
    """The staged leases among ``found`` grouped by place, as node ``here`` (default: this
    one, :func:`ocistage.cache.nodes.this_node`) sees them: leases with the same path or the
    same identity (recorded, or where the path of a lease that records none leads;
    :func:`same_place`) are one group, each in the order given. A lease recorded on another
    node is grouped only with that node's leases (its copy is not the one here)."""
    here = this_node() if here is None else here
    items = [lease for lease in found if lease.target.startswith(STAGED)]
    parent = list(range(len(items)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    coarse: dict[str, list[int]] = {}
    without_handle: list[tuple[int, str]] = []
    for i, lease in enumerate(items):
        view = lease.node if lease.node and lease.node != here else ""
        # another node's path leads elsewhere here: only what that node recorded places it
        identity = lease.identity or ("" if view else
                                      staged_identity(lease.target.removeprefix(STAGED)))
        for key in (lease.target, f"id:{identity}" if identity else ""):
            key = f"{view}\0{key}" if key else ""
            if key and key in first:
                parent[root(i)] = root(first[key])
            elif key:
                first[key] = i
        if identity:
            coarse_key = f"{view}\0{_coarse(identity)}"
            coarse.setdefault(coarse_key, []).append(i)
            if len(_split_identity(identity)[0]) <= 2:
                without_handle.append((i, coarse_key))
    for i, key in without_handle:  # of an earlier release: one place with each of its inode
        for j in coarse[key]:
            parent[root(j)] = root(i)
    groups: dict[int, list[Lease]] = {}
    for i, lease in enumerate(items):
        groups.setdefault(root(i), []).append(lease)
    return list(groups.values())


JobStates = Callable[[Iterable[str]], dict[str, str] | None]


def squeue_states(job_ids: Iterable[str]) -> dict[str, str] | None:
    """States of the given jobs from ``squeue``; None when Slurm cannot be asked.

    Jobs that squeue does not list any more have ended (they are absent from the result).
    """
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    try:
        result = subprocess.run(
            [squeue, "-h", "-o", "%i %T", "-j", ",".join(ids)],
            capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        # squeue fails for a list made only of unknown (long finished) jobs
        if "Invalid job id" in result.stderr:
            return {}
        return None
    states: dict[str, str] = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def is_live(lease: Lease, job_states: dict[str, str] | None,
            now: float | None = None) -> bool:
    """Whether ``lease`` still protects its target (see the module docstring)."""
    holder = lease.holder
    if holder.kind == "pin":
        return True
    if holder.kind == "pid":
        if holder.pid is None:
            return False
        alive = Owner(holder.host, holder.pid, holder.start).is_alive()
        return True if alive is None else alive
    if holder.kind == "slurm-job":
        if job_states is None:
            return True
        state = job_states.get(str(holder.job_id))
        return state is not None and state.split()[0].rstrip("+") in SLURM_ACTIVE_STATES
    return False


def job_states_of(leases: Iterable[Lease],
                  job_states: JobStates = squeue_states) -> dict[str, str] | None:
    """The states of the Slurm jobs that hold ``leases`` (one ``squeue``, none without jobs),
    for :func:`is_live`."""
    jobs = [str(lease.holder.job_id) for lease in leases if lease.holder.kind == "slurm-job"]
    return job_states(jobs) if jobs else {}


def dead_leases(cache_root: Path, job_states: JobStates = squeue_states) -> list[Lease]:
    leases = all_leases(cache_root)
    states = job_states_of(leases, job_states)
    return [lease for lease in leases if not is_live(lease, states)]


def live_targets(cache_root: Path, kinds: Iterable[str],
                 job_states: JobStates = squeue_states) -> set[str]:
    """The targets of ``kinds`` (``image``, ``blob``, ...) that live leases name, read once
    (Slurm is asked only about the holders of leases on such targets)."""
    prefixes = tuple(f"{kind}:" for kind in kinds)
    leases = [lease for lease in all_leases(cache_root)
              if any(t.startswith(prefixes) for t in lease.targets)]
    states = job_states_of(leases, job_states)
    return {t for lease in leases if is_live(lease, states) for t in lease.targets
            if t.startswith(prefixes)}


def gc_running(cache_root: Path) -> bool:
    """Whether a live ``cache gc`` (other than this process) holds ``CACHE/gc.lock``. A FIFO,
    symlink or outsider's file there is no lock: no GC holds it (and none can take it)."""
    path = cache_root / GC_LOCK
    if lock_owner(path) == Owner.me():
        return False  # the budget GC inside this very command
    return not owner_is_dead(path) and not is_foreign(path)


def wait_for_gc(cache_root: Path, poll: float = 0.2) -> None:
    """Return once no live GC holds the cache's GC lock."""
    while gc_running(cache_root):
        time.sleep(poll)


class InUse:
    """What the running command uses: one ``pid`` lease that grows as the command learns more.

    Call :meth:`protect` with the targets *before* looking at them (checking that a blob or a
    bundle exists); it records them and then waits for a running GC to finish, so no GC can
    delete them from under the command. Leaving the context (or a crash of the process) ends
    the lease.
    """

    def __init__(self, cache_root: Path, holder: Holder | None = None) -> None:
        self.cache_root = cache_root
        self.holder = holder or Holder.this_process()
        self._lease: Lease | None = None

    @property
    def targets(self) -> tuple[str, ...]:
        return self._lease.targets if self._lease is not None else ()

    def protect(self, targets: Iterable[str]) -> None:
        current = self.targets
        new = [check_target(t) for t in dict.fromkeys(targets) if t not in current]
        if not new:
            return
        if self._lease is None:
            lease = Lease(id=uuid.uuid4().hex, target=new[0], holder=self.holder,
                          created=time.time(), also=tuple(new[1:]))
        else:
            lease = Lease(id=self._lease.id, target=self._lease.target, holder=self.holder,
                          created=self._lease.created, also=(*self._lease.also, *new))
        _write(self.cache_root, lease)
        self._lease = lease
        wait_for_gc(self.cache_root)

    def release(self) -> None:
        if self._lease is not None:
            release(self.cache_root, self._lease.id)
            self._lease = None

    def __enter__(self) -> InUse:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
