"""ocistage as pyxis's image importer (``importer=`` in plugstack.conf; docs/pyxis.md).

pyxis runs ``IMPORTER get docker://IMAGE`` as the job user and reads the first line of its
stdout as the absolute path of a squashfs image, which enroot then starts (or unpacks with
``enroot create``); ``IMPORTER release`` (idempotent, called once or twice per step, also after
a failed ``get``) says the step is done with it.

``get`` here:

0. with the pull policy ``missing`` (the importer's default, :func:`effective_policy`) or
   ``never``, uses what the reference resolved to before if that image is in the store (a
   record in ``STORE/pyxis/refs/``; no network, no registry client: the warm get);
1. parses IMAGE in enroot's syntax, ``[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]``
   (:func:`parse_enroot_uri`);
2. pulls it through the cache as ``ocistage pull`` does (mirrors, ``--pull`` policy, site and
   user config; credentials from the docker/podman auth files and from enroot's own
   ``.credentials`` netrc, :class:`EnrootCredentials`);
3. takes a lease for the job step (``squashfs:<key>``, held by the Slurm job; ``cache gc`` keeps
   what a live job holds) and looks for the image's squashfs, keyed by manifest digest, format
   and compressor, in the store (``STORE/pyxis/<key>.sqsh``; STORE is the cache, or the site's
   ``pyxis_store``);
4. if it is missing, takes the key's lock (one build for all the ranks and nodes asking at
   once; the others wait and reuse it), makes the image's rootfs through the cache
   (:func:`ocistage.bundler.flows.bundle.make_bundle`), adds the files ``enroot import`` writes into
   a rootfs (:func:`~ocistage.bundler.enroot_files.enroot_files`, which refuses values that
   would change those files' structure) and builds the squashfs with mksquashfs in a scratch
   directory of the store, published by one ``rename()``.

Nothing half-built is ever at a key's path; a failed build leaves only its scratch directory,
which the next command (or ``cache gc``) removes, and its partial downloads, which the next
``get`` resumes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.bundler.enroot_files import enroot_files as enroot_files
from ocistage.bundler.errors import PyxisImportError
from ocistage.bundler.image.errors import InvalidReference
from ocistage.bundler.image.reference import (
    DEFAULT_REGISTRY,
    OFFICIAL_REPOSITORY_PREFIX,
    RegistryReference,
    parse_registry_reference,
)
from ocistage.bundler.registry.credentials import (
    DOCKER_HUB_ALIASES,
    Credentials,
    CredentialStore,
    SkippedFile,
    read_credentials_file,
)
from ocistage.bundler.settings import DEFAULT, Settings
from ocistage.cache import leases
from ocistage.cache.atomicwrite import fsync_dir, write_file_atomic
from ocistage.cache.cpus import usable_cpus
from ocistage.cache.errors import LockTimeout, StoreError
from ocistage.cache.jsondoc import read_document
from ocistage.cache.leases import InUse
from ocistage.cache.locks import FileLock
from ocistage.cache.pyxisimages import (
    IMAGE_DIR,
    IMAGE_SUFFIX,
    REFS_DIR,
    image_path_at,
    squashfs_target,
    touch,
)
from ocistage.cache.store import Store
from ocistage.cache.userdirs import home_dir, owned_by_caller
from ocistage.stagers.errors import PseudoNameError, ToolFailed
from ocistage.stagers.mksquashfs import compressors_listed as compressors_listed
from ocistage.stagers.mksquashfs import (
    help_text,
    pseudo_dir,
    pseudo_file,
    pseudo_name,
    run_tool,
)

if TYPE_CHECKING:
    from ocistage.bundler.pull import PullOptions

log = logging.getLogger(__name__)

#: bump when what goes into an image changes (the files of enroot_files, mksquashfs options)
IMAGE_FORMAT = 2
LEASE_PREFIX = "pyxis-"
#: how long a get waits for another process building the same image
BUILD_WAIT = 3 * 3600.0
MKSQUASHFS_TIMEOUT = 3 * 3600
#: compressors in order of preference; enroot's own default (lzo) is missing on RHEL 9
COMPRESSORS = ("zstd", "gzip")
#: the levels of the command-line tools' defaults; mksquashfs's own (zstd 15, gzip 9) took 25
#: and 3 times as long for an image 5% and 2% smaller (bench/README.md, "pyxis")
COMPRESSION_LEVELS = {"zstd": 3, "gzip": 6}
NETRC_NAME = ".credentials"
_ENROOT_PREFIX = "docker://"
_DIGEST_START = "sha256:"
_USER_RE = re.compile(r"[A-Za-z0-9_.!~*'()%;:&=+$,\-]+")
_ENV_REF_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


# -- the image URI -----------------------------------------------------------------------------

@dataclass(frozen=True)
class EnrootUri:
    """An image named the way enroot and pyxis name it; ``user`` picks the credentials."""

    user: str | None
    reference: RegistryReference


def parse_enroot_uri(text: str) -> EnrootUri:
    """Parse ``docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]`` (the ``docker://`` is optional).

    ``REGISTRY#IMAGE`` names the registry literally (``nvcr.io#nvidia/pytorch:24.01``); without
    ``#``, Docker's rules apply (``nvcr.io/nvidia/pytorch``, ``ubuntu`` on docker.io). A user
    is what comes before an ``@`` that does not start the digest.
    """
    body = text.removeprefix(_ENROOT_PREFIX)
    if not body:
        raise InvalidReference(f"{text!r} names no image",
                               "pyxis passes docker://[USER@][REGISTRY#]IMAGE[:TAG]")
    user, body = _split_user(body, text)
    if "#" not in body:
        return EnrootUri(user, parse_registry_reference(body))
    registry, _, image = body.partition("#")
    if not registry or not image or "#" in image or "/" in registry:
        raise InvalidReference(f"{text!r} is not REGISTRY#IMAGE[:TAG]",
                               "write the registry before '#' and the image after it, e.g. "
                               "nvcr.io#nvidia/pytorch:24.01-py3")
    parsed = parse_registry_reference(f"localhost/{image}", shown=text)  # errors name the URI
    repository = parsed.repository
    if registry in DOCKER_HUB_ALIASES:
        registry = DEFAULT_REGISTRY
        if "/" not in repository:
            repository = OFFICIAL_REPOSITORY_PREFIX + repository
    try:
        return EnrootUri(user, RegistryReference(registry, repository, parsed.tag,
                                                 parsed.digest))
    except InvalidReference as exc:  # the registry before '#' (a port out of range, ...)
        raise InvalidReference(f"{text!r}: {exc.message}", exc.hint) from exc


def _split_user(body: str, text: str) -> tuple[str | None, str]:
    at = body.find("@")
    if at < 0 or body.startswith(_DIGEST_START, at + 1):
        return None, body
    hash_at = body.find("#")
    if hash_at >= 0 and hash_at < at:
        return None, body  # REGISTRY#IMAGE@sha256:... is checked by the reference parser
    user = body[:at]
    if not _USER_RE.fullmatch(user):
        raise InvalidReference(f"{text!r} has an invalid user name {user!r}",
                               "write docker://USER@REGISTRY#IMAGE:TAG")
    return user, body[at + 1:]


# -- credentials: enroot's netrc ---------------------------------------------------------------

@dataclass(frozen=True)
class NetrcEntry:
    machine: str
    login: str
    password: str = dataclasses.field(repr=False)


def enroot_config_dir(environ: Mapping[str, str]) -> Path:
    """enroot's ``$ENROOT_CONFIG_PATH`` (default ``$XDG_CONFIG_HOME/enroot``, else
    ``~/.config/enroot``); pyxis removes ``ENROOT_*`` from the importer's environment, so
    usually the default."""
    configured = environ.get("ENROOT_CONFIG_PATH")
    if configured and os.path.isabs(configured):
        return Path(configured)
    xdg = environ.get("XDG_CONFIG_HOME")
    if xdg and os.path.isabs(xdg) and owned_by_caller(Path(xdg)):
        return Path(xdg) / "enroot"
    return home_dir(environ) / ".config" / "enroot"


def parse_netrc(text: str, environ: Mapping[str, str], where: str) -> list[NetrcEntry]:
    """The ``machine HOST login USER password PASS`` lines of enroot's ``.credentials``.

    A password ``$NAME`` or ``${NAME}`` is taken from the environment, as enroot does; enroot
    runs anything else starting with ``$`` (``$(command)``) through a shell, which this refuses.
    """
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) < 6 or words[0] != "machine" or words[2] != "login" or words[4] != "password":
            continue
        password = " ".join(words[5:])
        if password.startswith("$"):
            password = _expand(password, environ, f"{where}:{number}")
        entries.append(NetrcEntry(words[1], words[3], password))
    return entries


def _expand(value: str, environ: Mapping[str, str], where: str) -> str:
    match = _ENV_REF_RE.fullmatch(value)
    if match is None:
        raise PyxisImportError(
            f"{where}: the password {value[:20]!r}... runs a command in enroot's shell",
            "ocistage runs no commands from the credentials file: put the secret in an "
            "environment variable and write `password $NAME`, or use ~/.docker/config.json")
    name = match.group(1) or match.group(2)
    if name not in environ:
        raise PyxisImportError(f"{where}: the password names ${name}, which is not set",
                               f"export {name} in the job's environment")
    return environ[name]


def _machines(registry: str) -> tuple[str, ...]:
    """The netrc machine names of a registry: its host without the port (as enroot matches
    it), and for docker.io the names enroot uses for it."""
    host = registry.rsplit(":", 1)[0] if not registry.endswith("]") else registry
    return DOCKER_HUB_ALIASES if host in DOCKER_HUB_ALIASES else (host,)


class EnrootCredentials(CredentialStore):
    """The auth files ocistage reads (docker, podman), plus enroot's ``.credentials``.

    With a user in the URI (``USER@REGISTRY#IMAGE``) that user's netrc entry is used first;
    without one, the auth files first, then the first netrc entry for the registry (enroot
    infers the user the same way).
    """

    def __init__(self, user: str | None, environ: Mapping[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        base = CredentialStore.from_environment(env)
        super().__init__(base.auth_files, env)
        self.user = user
        self.netrc = enroot_config_dir(env) / NETRC_NAME
        self._env = env
        self._entries: list[NetrcEntry] | None = None

    def entries(self) -> list[NetrcEntry]:
        if self._entries is None:
            self._entries = parse_netrc(_read_netrc(self.netrc), self._env, str(self.netrc))
        return self._entries

    def lookup(self, registry: str, repository: str | None = None) -> Credentials | None:
        machines = _machines(registry)
        if self.user is not None:
            for entry in self.entries():
                if entry.machine in machines and entry.login == self.user:
                    return Credentials(entry.login, entry.password)
        found = super().lookup(registry, repository)
        if found is not None:
            return found
        for entry in self.entries():
            if entry.machine in machines:
                return Credentials(entry.login, entry.password)
        return None


def _read_netrc(path: Path, limit: int = 1 << 20) -> str:
    """The text of enroot's ``.credentials`` (read as the auth files are:
    :func:`~ocistage.bundler.registry.credentials.read_credentials_file`); empty if there is
    none. A FIFO or other special file is skipped without a word, as enroot skips it; a
    symlink or another user's file with a warning (enroot would read them)."""
    try:
        data = read_credentials_file(path, limit=limit)
    except SkippedFile as skipped:
        if not skipped.special:
            log.warning("%s; not reading it for registry credentials", skipped.reason)
        return ""
    except ValueError as exc:
        raise PyxisImportError(f"{path} is {exc}", "a credentials file holds a few lines"
                               ) from exc
    except OSError as exc:
        raise PyxisImportError(f"cannot read {path}: {exc.strerror}",
                               "fix its permissions or remove it") from exc
    return "" if data is None else data.decode("utf-8", errors="replace")


# -- mksquashfs --------------------------------------------------------------------------------

def probe_compressor(mksquashfs: str) -> str:
    """The first of :data:`COMPRESSORS` that ``mksquashfs -help`` lists as available."""
    try:
        text = help_text(mksquashfs)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PyxisImportError(f"cannot run {mksquashfs} -help: {exc}") from exc
    available = compressors_listed(text)
    for name in COMPRESSORS:
        if name in available:
            return name
    raise PyxisImportError(f"{mksquashfs} offers none of {', '.join(COMPRESSORS)} "
                           f"(it lists {', '.join(available) or 'no compressor'})",
                           "install a squashfs-tools built with zstd or gzip")


def _pseudo_dirs(rootfs: Path, relative: str) -> list[str]:
    """Pseudo definitions for the directories of ``relative`` missing from ``rootfs``; none
    below a component that exists but is no directory (enroot's mkdir would fail there too).
    Every name is escaped (:func:`~ocistage.stagers.mksquashfs.pseudo_name`): an image's
    WorkingDir is data, never a definition of its own (issue 39)."""
    parts = [p for p in relative.split("/") if p and p not in (".", "..")]
    if not parts:
        return []
    pseudo_name(parts)  # refuse what no definition can carry before any path is looked at
    result = []
    for depth in range(1, len(parts) + 1):
        try:
            st = os.lstat(rootfs.joinpath(*parts[:depth]))
        except FileNotFoundError:
            result.append(pseudo_dir(parts[:depth], 0o755, 0, 0))
            continue
        except OSError:
            return result
        if not stat.S_ISDIR(st.st_mode):  # a file, or a link (not followed out of the rootfs)
            return result
    return result


def mksquashfs_argv(mksquashfs: str, rootfs: Path, image: Path, files: Mapping[str, Path],
                    workdir: str, compressor: str, jobs: int) -> list[str]:
    """The mksquashfs command of an image: ``rootfs`` owned by root (``-all-root``, as enroot
    makes it), without what is under /dev, with ``files`` (path inside -> file) replacing the
    image's own and ``workdir`` made. Raises
    :class:`~ocistage.stagers.errors.PseudoNameError` for a ``workdir`` no image can hold."""
    level = COMPRESSION_LEVELS.get(compressor)
    argv = [mksquashfs, os.fspath(rootfs), os.fspath(image), "-comp", compressor,
            *(["-Xcompression-level", str(level)] if level is not None else []),
            "-noappend", "-no-progress", "-quiet", "-no-recovery", "-all-root",
            "-processors", str(max(1, jobs))]
    pseudo: list[str] = []
    for inside in sorted(files):
        parent = inside.rpartition("/")[0]
        pseudo += [p for p in _pseudo_dirs(rootfs, parent) if p not in pseudo]
    pseudo += [p for p in _pseudo_dirs(rootfs, workdir) if p not in pseudo]
    pseudo += [pseudo_file(inside.split("/"), 0o644, 0, 0,
                           f"cat {shlex.quote(os.fspath(files[inside]))}")
               for inside in sorted(files)]
    for definition in pseudo:
        argv += ["-p", definition]
    # -e takes the rest of the command line
    argv += ["-wildcards", "-e", "dev/*", *sorted(files)]
    return argv


def run_mksquashfs(argv: Sequence[str], store: Path) -> None:
    """Run mksquashfs (writing into ``store``) as every mksquashfs is run
    (:func:`ocistage.stagers.mksquashfs.run_tool`: killed with this process, however it
    ends); its failure said the importer's way (:func:`mksquashfs_error`)."""
    try:
        run_tool(argv, "mksquashfs", timeout=MKSQUASHFS_TIMEOUT, output=Path(argv[2]))
    except ToolFailed as exc:
        if exc.status is None:
            raise PyxisImportError(exc.message, exc.hint) from exc
        said = exc.said + ((os.strerror(errno.ENOSPC),) if exc.no_space else ())
        raise mksquashfs_error("\n".join(said), exc.status, store) from exc


def mksquashfs_error(output: str, status: int, store: Path) -> PyxisImportError:
    """The error of a failed mksquashfs: its last line, or that ``store`` is full."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if any(os.strerror(errno.ENOSPC) in line for line in lines):
        return PyxisImportError(f"no space left on the filesystem of {store} for the image",
                                "free space there, or point pyxis_store (docs/pyxis.md) at a "
                                "larger filesystem")
    return PyxisImportError(f"mksquashfs failed: {lines[-1] if lines else f'exit {status}'}",
                            f"check the free space of {store} (docs/pyxis.md)")


# -- the store of images -----------------------------------------------------------------------

def image_key(manifest_digest: str, compressor: str) -> str:
    shape = {"format": IMAGE_FORMAT, "manifest": manifest_digest, "compressor": compressor}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def image_path(store: Store, key: str) -> Path:
    return image_path_at(store.root, key)


@dataclass(frozen=True)
class JobStep:
    """Who holds an image: the Slurm job and step of the environment, or no job (a pin that
    ``release`` in a shell without SLURM_JOB_ID drops)."""

    job_id: str | None
    step_id: str

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> JobStep:
        job = environ.get("SLURM_JOB_ID") or None
        step = environ.get("SLURM_STEP_ID") or "none"
        if not re.fullmatch(r"[A-Za-z0-9_+-]{1,40}", step):
            step = "none"
        return cls(job, step)

    @property
    def prefix(self) -> str:
        return f"{LEASE_PREFIX}{self.job_id or 'nojob'}.{self.step_id}-"

    def holder(self) -> leases.Holder:
        if self.job_id is None:
            return leases.Holder.pin(f"pyxis {os.getuid()}")
        return leases.Holder.slurm_job(self.job_id)


def hold(store: Store, key: str, step: JobStep) -> leases.Lease:
    """Record the step's lease on image ``key`` (one per step and image: a repeated get
    rewrites it), then wait for a running GC, so that the image is looked at only once no GC
    can take it."""
    lease = leases.Lease(id=f"{step.prefix}{key[:32]}", target=squashfs_target(key),
                         holder=step.holder(), created=time.time())
    leases.record(store.root, lease)
    leases.wait_for_gc(store.root)
    return lease


def release_step(stores: Sequence[Path], step: JobStep) -> int:
    """Drop every lease of ``step`` in ``stores`` (their roots); returns how many."""
    dropped = 0
    for root in stores:
        directory = root / "leases"
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(directory):
                if entry.name.startswith(step.prefix) and entry.name.endswith(".json"):
                    dropped += leases.release(root, entry.name.removesuffix(".json"))
    return dropped


def _present(path: Path) -> bool:
    try:
        return os.path.isfile(path) and not os.path.islink(path)
    except OSError:
        return False


def images_directory(store: Store, *parts: str) -> Path:
    """``STORE/pyxis`` (or a directory below it), made if missing as the store's own
    directories are (the umask decides: ``002`` keeps a group-shared store writable by the
    group, and the setgid bit is inherited), and checked against the trust rule as they are
    (docs/trust.md): the caller's or root's and not writable by others, or, in a group-shared
    store, a setgid directory of the caller's group. Never a symlink."""
    from ocistage.cache.dirtrust import check_trusted_dir

    directory = store.root / IMAGE_DIR
    for part in ("", *parts):
        directory = directory / part if part else directory
        try:
            directory.mkdir(exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot make {directory}: {exc.strerror}") from exc
        check_trusted_dir(directory, "pyxis store directory", group_shared=True)
    return directory


@contextlib.contextmanager
def build_lock(store: Store, key: str, wait: float = BUILD_WAIT) -> Iterator[None]:
    """The lock of building image ``key`` (one build; the others wait for it)."""
    lock = FileLock(images_directory(store) / f"{key}.lock")
    try:
        lock.acquire(timeout=wait, poll=0.5)
    except LockTimeout as exc:
        raise LockTimeout(f"another process has been building image {key[:12]} for "
                          f"{int(wait)} s", "retry the job later") from exc
    try:
        yield
    finally:
        lock.release()


def publish(store: Store, built: Path, key: str, record: Mapping[str, Any]) -> Path:
    """Move the finished image ``built`` to its key's path with its record beside it."""
    final = image_path(store, key)
    os.chmod(built, 0o644)
    info = built.with_name(built.name + ".json")
    info.write_text(json.dumps(dict(record), sort_keys=True) + "\n")
    os.chmod(info, 0o644)
    os.rename(info, final.with_suffix(".json"))
    os.rename(built, final)
    fsync_dir(final.parent)
    return final


def provide(store: Store, key: str, step: JobStep,
            make: Callable[[], object]) -> tuple[Path, bool]:
    """Image ``key`` in ``store``, leased to ``step``; ``make()`` builds and publishes it when
    it is missing, under the key's lock, so that of all the processes asking at once one
    builds and the others wait and reuse it. Returns the path and whether this call built it."""
    hold(store, key, step)
    images_directory(store)  # an image is looked for only in a trusted directory
    final = image_path(store, key)
    if _present(final):
        return final, False
    with build_lock(store, key):
        if _present(final):  # built by whoever held the lock before us
            return final, False
        make()
    if not _present(final):
        raise StoreError(f"image {key[:12]} was built but is not at {final}")
    return final, True


@dataclass(frozen=True)
class GetResult:
    path: Path
    built: bool              # this call made the image
    manifest: str
    key: str


def mksquashfs_path() -> str:
    path = shutil.which("mksquashfs") or next(
        (p for p in ("/usr/sbin/mksquashfs", "/usr/bin/mksquashfs", "/sbin/mksquashfs")
         if os.access(p, os.X_OK)), None)
    if path is None:
        raise PyxisImportError("mksquashfs is not installed on this node",
                               "install squashfs-tools (the package enroot needs too)")
    return path


def pull_options(settings: Settings, credentials: CredentialStore, policy: str) -> PullOptions:
    from ocistage.bundler.pull import PullOptions

    registry = dataclasses.replace(settings.registry_config(), credentials=credentials)
    return PullOptions(jobs=settings.jobs, registry=registry, max_size=settings.max_size,
                       policy=policy, unpack_limit=settings.unpack_limit,
                       trust=settings.trust_config())


def image_store(settings: Settings) -> Store:
    """Where images go: the site's ``pyxis_store`` if set and this user may write there,
    else the user's cache (a shared store someone else fills is only read: :func:`get`; a
    store that does not exist is the site's to make, with the mode it wants: docs/pyxis.md)."""
    if settings.pyxis_store is not None and os.access(settings.pyxis_store, os.W_OK):
        return Store.open(settings.pyxis_store)
    return Store.open(settings.cache)


def shared_image(settings: Settings, key: str) -> Path | None:
    """The image ``key`` in a site store this user cannot write (filled by the site), if it
    is there and the store passes the trust rule (docs/trust.md)."""
    root = settings.pyxis_store
    if root is None or os.access(root, os.W_OK) or not readable_store(root):
        return None
    path = image_path(Store(root), key)
    return path if _present(path) else None


def readable_store(root: Path, *parts: str) -> bool:
    """Whether the store at ``root``, which this user only reads, has ``pyxis/`` (and
    ``parts`` below it); each directory must pass the trust rule (docs/trust.md), else
    :class:`~ocistage.cache.errors.UntrustedPath`. A store the site has not filled yet has
    none, as a store the site has not made: nothing to read there."""
    from ocistage.cache.dirtrust import check_trusted_dir

    if not os.path.exists(root):
        return False
    check_trusted_dir(root, "pyxis store", group_shared=True, follow=True)
    directory = root / IMAGE_DIR
    for part in ("", *parts):
        directory = directory / part if part else directory
        if not os.path.lexists(directory):
            return False
        check_trusted_dir(directory, "pyxis store directory", group_shared=True)
    return True


def effective_policy(settings: Settings) -> str:
    """The pull policy of a get: the configured one (``--pull`` has no option here: the
    environment or a config file), else ``missing``: a reference imported before is used as
    it was, without asking the registry (docs/pyxis.md)."""
    return settings.pull if settings.origins.get("pull", DEFAULT) != DEFAULT else "missing"


def record_name(reference: RegistryReference) -> str:
    """The file name of what ``reference`` resolved to on this host's architecture."""
    text = f"{IMAGE_FORMAT}\n{reference}\n{os.uname().machine}"
    return hashlib.sha256(text.encode()).hexdigest() + ".json"


def remember(store: Store, reference: RegistryReference, key: str, manifest: str) -> None:
    """Note that ``reference`` is image ``key`` (read by :func:`recall`)."""
    directory = images_directory(store, REFS_DIR)
    data = json.dumps({"reference": str(reference), "key": key, "manifest": manifest,
                       "resolved": time.time()}, sort_keys=True).encode()
    write_file_atomic(directory / record_name(reference), data)


def recall(root: Path, reference: RegistryReference) -> tuple[str, str] | None:
    """The image key and manifest ``reference`` last resolved to in the store at ``root``,
    if that image is there (an unreadable record is no record)."""
    path = root / IMAGE_DIR / REFS_DIR / record_name(reference)
    try:
        data = json.loads(read_document(path, 64 << 10))
        key, manifest = str(data["key"]), str(data["manifest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not re.fullmatch(r"[0-9a-f]{64}", key) or not _present(image_path_at(root, key)):
        return None
    return key, manifest


def _recalled(settings: Settings, reference: RegistryReference,
              step: JobStep) -> GetResult | None:
    """The image a reference resolved to before, leased to ``step``; None if there is none.
    No network and no registry client: the warm get."""
    shared = settings.pyxis_store
    if shared is not None and not os.access(shared, os.W_OK) and readable_store(shared,
                                                                                 REFS_DIR):
        found = recall(shared, reference)
        if found is not None and shared_image(settings, found[0]) is not None:
            return GetResult(image_path_at(shared, found[0]), False, found[1], found[0])
    store = image_store(settings)
    images_directory(store, REFS_DIR)  # notes and images: only from trusted directories
    found = recall(store.root, reference)
    if found is None:
        return None
    hold(store, found[0], step)
    final = image_path(store, found[0])
    if not _present(final):
        return None
    touch(store.root, found[0])
    return GetResult(final, False, found[1], found[0])


def get(uri: str, settings: Settings, step: JobStep,
        environ: Mapping[str, str] | None = None) -> GetResult:
    """``importer get URI``: the image's squashfs, made once, leased to ``step``."""
    from ocistage.bundler.trust.files import policy_applies

    parsed = parse_enroot_uri(uri)
    policy = effective_policy(settings)
    # an image policy decides in the pull, also for an image made before: no recall then
    if policy != "always" and not policy_applies(settings.trust_config()):
        found = _recalled(settings, parsed.reference, step)
        if found is not None:
            return found
    credentials = EnrootCredentials(parsed.user, environ)
    options = pull_options(settings, credentials, policy)
    cache = Store.open(settings.cache)
    # one lease from the pull to mksquashfs's last read: another member's gc of a group-shared
    # cache evicted the image's blobs between the two (the endurance test)
    with InUse(cache.root) as in_use:
        manifest = pull_manifest(parsed.reference, cache, options, in_use)
        mksquashfs = mksquashfs_path()
        compressor = probe_compressor(mksquashfs)
        key = image_key(manifest, compressor)
        shared = shared_image(settings, key)
        if shared is not None:
            return GetResult(shared, False, manifest, key)
        store = image_store(settings)
        final, built = provide(store, key, step, lambda: build(
            parsed.reference, cache, store, key, options, mksquashfs, compressor, manifest,
            in_use))
    remember(store, parsed.reference, key, manifest)
    touch(store.root, key)
    return GetResult(final, built, manifest, key)


def pull_manifest(reference: RegistryReference, cache: Store, options: PullOptions,
                  in_use: InUse | None = None) -> str:
    """Pull ``reference`` into ``cache`` as ``ocistage pull`` does (no cache budget: a GC
    during a job's start would only slow it), under the caller's lease ``in_use`` if given;
    the manifest digest. A refusal of the policy ``never`` says how to change it where pyxis
    users can (no ``--pull`` here)."""
    from ocistage.bundler.errors import SourceError
    from ocistage.bundler.pull import pull

    try:
        pulled = pull(reference, cache, dataclasses.replace(options, max_size=None),
                      in_use=in_use)
    except SourceError as exc:
        if options.policy != "never":
            raise
        raise PyxisImportError(
            f"{exc.message}, and the pull policy is never",
            "pull it first (`ocistage pull` with the job's cache), or unset OCISTAGE_PULL "
            "(or `pull` in the config file): the importer's default is missing") from exc
    return str(pulled.manifest.digest)


def build(reference: RegistryReference, cache: Store, store: Store, key: str,
          options: PullOptions, mksquashfs: str, compressor: str, manifest: str,
          in_use: InUse) -> Path:
    """Make image ``key`` of ``reference`` (pulled already: from the cache) and publish it.
    The cached bundle is leased (``in_use``, the caller's) until mksquashfs has read it:
    another member's gc of a group-shared cache would otherwise evict it from under mksquashfs
    (the endurance test)."""
    from ocistage.bundler.flows.bundle import make_bundle

    bundle = make_bundle(reference, cache, in_use=in_use,
                         pull_options=dataclasses.replace(options, policy="missing"))
    if str(bundle.image.manifest.digest) != manifest:
        raise PyxisImportError(f"{reference} changed while it was imported "
                               f"({manifest} became {bundle.image.manifest.digest})",
                               "run the job again")
    config = json.loads(cache.read_blob(bundle.image.config_digest))
    files, workdir = enroot_files(config if isinstance(config, dict) else {}, str(reference))
    scratch = store.temp_dir("pyxis")
    try:
        written = {}
        for n, (inside, data) in enumerate(sorted(files.items())):
            written[inside] = scratch / f"file{n}"
            written[inside].write_bytes(data)
        built = scratch / f"{key}{IMAGE_SUFFIX}"
        try:
            argv = mksquashfs_argv(mksquashfs, bundle.path / "rootfs", built, written,
                                   workdir, compressor, usable_cpus())
        except PseudoNameError as exc:
            raise PyxisImportError(f"{reference}: its config's WorkingDir {workdir!r} cannot be "
                                   f"made in the image: {exc.message}",
                                   "fix the image's WorkingDir (a plain absolute path)") from exc
        run_mksquashfs(argv, store.root)
        record = {"source": str(reference), "manifest": manifest,
                  "platform": str(bundle.image.platform), "compressor": compressor,
                  "format": IMAGE_FORMAT, "created": time.time()}
        return publish(store, built, key, record)
    except OSError as exc:
        raise StoreError(f"cannot make the image of {reference} in {store.root}: "
                         f"{exc.strerror}") from exc
    finally:
        store.remove_temp_dir(scratch)
