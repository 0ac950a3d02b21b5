"""``ocistage bundle``: a pulled image -> a runtime bundle (``rootfs/`` + ``config.json``).

Layers are unpacked while they download: the pull runs in a thread
(:mod:`ocistage.bundler.follower`)
and tells this module when the config is known; every layer is then applied in order
(:mod:`ocistage.bundler.unpack.layerchain`, for the rootfs :mod:`ocistage.bundler.rootfs` makes),
read from its growing download, decompressed in a thread of its own, its uncompressed stream hashed
and compared with the config's ``diff_id``. Nothing is published before the pull verified every
blob and every diff_id matched.

Every bundle's tree is cloned from a *snapshot* (:mod:`ocistage.cache.snapshots`): the tree of the
image's layers, kept in the cache by ChainID and made first when missing (on the longest cached
prefix: an image sharing base layers with a cached one only fetches and unpacks its new layers).
An image unpacked once is never unpacked again, whichever command came first.

- a bundle in the cache (no DEST) or with ``link=True``: its ``rootfs/`` is a hard-linked clone
  of the snapshot (new directories, shared file inodes), so a warm bundle costs a ``cp -al``.
  Such bundles get ``root.readonly: true`` so a container cannot write into the shared files
  (a writable private bundle needs a DEST).
- a bundle at DEST without ``link``: an independent copy of the snapshot (``cp -a
  --reflink=auto``, split over the free cores; no data copied where the filesystem shares
  extents). What keeping the snapshot costs a cold bundle: docs/performance.md.

- a ``--no-rootless`` bundle made by root (:func:`_owners`): unpacked from the blobs with the
  image's owners, never through a snapshot (:mod:`ocistage.bundler.rootfs` says why), and kept
  owner-only wherever it is, its files belonging to other host uids.

Either way the bundle is built in a scratch directory and published by one ``rename()``: a
crash leaves no half bundle at the final path. The bundle's directory is owner-only (0700), as
are the snapshots (docs/trust.md rule 3): ``rootfs/`` keeps the image's setuid/setgid bits and
file capabilities for the container, and no other user of the host reaches them. In a
group-shared cache a cached bundle is open to the group and its files lose those privileges
(:func:`ocistage.cache.snapshots.strip_for_group`, with a warning). ``config.json`` is
generated from the image config and validated before it is written.

Without DEST the bundle goes to ``CACHE/bundles/<key>``, keyed by the manifest digest and the
options that shape the bundle, so asking twice for the same bundle returns the existing one.
Such a bundle records the manifest it was made from
(``ocistage.cache.bundleinfo.write_bundle_info``, so
``cache gc`` knows when its image is gone) and its last use (``ocistage.cache.usage``); the command
holds a lease on it and on the image while it works, and GCs down to
``PullOptions.max_size`` at the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.bundler.configoptions import ConfigOptions
from ocistage.bundler.errors import DestinationError
from ocistage.bundler.follower import PullThread
from ocistage.bundler.image.manifest import Descriptor
from ocistage.bundler.image.reference import ImageSource
from ocistage.bundler.pull import (
    CANCEL_GRACE,
    NO_PROGRESS,
    PulledImage,
    PullOptions,
    PullProgress,
    PullRun,
    interrupted,
)
from ocistage.cache import usage
from ocistage.cache.atomicwrite import fsync_dir
from ocistage.cache.builddirs import remove_dead_scratch, scratch_name
from ocistage.cache.bundleinfo import SHARED_ROOT_ANNOTATION, write_bundle_info
from ocistage.cache.digest import Digest
from ocistage.cache.dirtrust import check_shared_parent
from ocistage.cache.errors import StoreError
from ocistage.cache.jsondoc import parse_json, read_document
from ocistage.cache.leases import InUse
from ocistage.cache.notice import Kind, Notice
from ocistage.cache.privatedirs import PRIVATE_DIR_MODE, make_private
from ocistage.cache.sizes import count
from ocistage.cache.store import Store
from ocistage.cache.treeremoval import remove_tree
from ocistage.errors import OcistageError, UsageError

if TYPE_CHECKING:
    from ocistage.results import Renderer

BUNDLE_FORMAT = 2  # bump when the bundle layout or config generation changes meaning
# 2: the rootfs holds its mounts' mount points (ocistage.bundler.rootfsmounts)


@dataclass(frozen=True)
class BundleResult:
    path: Path
    image: PulledImage
    reused: bool                      # an identical bundle existed already
    warnings: tuple[Notice, ...] = ()
    layers_applied: int = 0           # layers unpacked by this call (0: all from snapshots)
    snapshot: Path | None = None      # the snapshot rootfs the bundle links to, if any

    def to_json(self) -> dict[str, Any]:
        """What ``bundle --json`` prints."""
        return {"path": str(self.path), "reused": self.reused,
                "layers_applied": self.layers_applied,
                "warnings": [str(notice) for notice in self.warnings],
                "image": self.image.to_json()}

    def render(self, out: Renderer) -> None:
        out.note(f"{'reused' if self.reused else 'made'} bundle of {self.image.name} "
                 f"({self.image.platform}, {count(len(self.image.layers), 'layer')})")
        out.line(str(self.path))


#: options of :class:`ConfigOptions` added after caches existed (tests/e2e/test_upgrade_cache.py)
KEYED_WHEN_SET = ("map_self",)


def _bundle_key(manifest_digest: Digest, options: ConfigOptions, owners: bool = False) -> str:
    """The cache key of a bundle: manifest digest plus every option that changes the result,
    and whether its files have the image's owners (``rootless`` alone does not say it: a
    ``--no-rootless`` bundle of a user who is not root has the caller's; and such a bundle
    made by root before its owners were restored must not be served as one that has them)."""
    fields = asdict(options)
    for name in KEYED_WHEN_SET:  # options added later: keyed only when set, so that the
        if not fields[name]:     # bundles of every cache made before stay what they were
            del fields[name]
    shape: dict[str, object] = {"format": BUNDLE_FORMAT, "manifest": str(manifest_digest),
                                "options": fields}
    if owners:  # absent otherwise: the keys of every other bundle stay what they were
        shape["owners"] = "image"
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()


def _check_destination(dest: Path) -> None:
    """A bundle's DEST must be absent or an empty directory, and not a symbolic link."""
    try:
        info = dest.lstat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"cannot use {dest} as the destination: {exc.strerror}") from exc
    if stat.S_ISLNK(info.st_mode):
        raise UsageError(f"{dest} is a symbolic link",
                         "give the directory it points to, or a new path")
    if not stat.S_ISDIR(info.st_mode) or any(dest.iterdir()):
        raise UsageError(f"{dest} exists and is not an empty directory",
                         "choose a new destination, or remove it first")


def _make_parents(dest: Path) -> None:
    """Create the missing directories above DEST (as ``mkdir -p``)."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise DestinationError(f"cannot create {dest}: {exc.strerror or exc}{where}") from exc


def _scratch_beside(dest: Path, cached: bool) -> Path:
    """The scratch dir DEST (``cached``: a bundle in the cache) is built in, beside it; an
    error names DEST, not the scratch dir."""
    remove_dead_scratch(dest.parent, dest.name)  # left by a build that was killed
    scratch = dest.parent / scratch_name(dest.name)
    try:
        scratch.mkdir(mode=0o700)
    except OSError as exc:
        if cached:
            raise StoreError(f"cannot create {dest}: {exc.strerror}") from exc
        raise DestinationError(f"cannot create {dest}: {exc.strerror}",
                               f"check that you may write in {dest.parent}") from exc
    return scratch


def make_bundle(
    source: ImageSource,
    store: Store,
    dest: Path | None = None,
    *,
    pull_options: PullOptions | None = None,
    config_options: ConfigOptions | None = None,
    progress: PullProgress | None = None,
    on_layer: Callable[[int, Descriptor], None] | None = None,
    on_config: Callable[[Digest], None] | None = None,
    link: bool = False,
    keep_snapshot: bool = False,
    in_use: InUse | None = None,
) -> BundleResult:
    """Pull ``source`` (reusing the cache) and make a bundle at ``dest`` or in the cache.

    ``link``: make ``dest`` from a cached snapshot by hard links, with a read-only root (see
    the module docstring); ignored without ``dest`` (cached bundles always link).
    ``keep_snapshot``: a writable ``dest`` is copied from the image's snapshot, made first
    when missing, even where that copy is no reflink (:mod:`ocistage.bundler.rootfs`).
    ``on_layer(n, descriptor)`` is called before layer ``n`` is unpacked.
    ``on_config(manifest_digest)`` is called once the pull has resolved the manifest and read
    the config, before anything is unpacked (the layers may be downloading); an exception it
    raises ends the call (the downloads finish into the cache first).
    ``in_use``: the caller's lease of ``store``, which then keeps what this bundle is made of
    and the cached bundle itself from GC after the call, for as long as the caller holds it
    (``stage REF`` copying it, the importer's mksquashfs reading it); by default a lease of
    the call's own, ended when it returns.
    """
    pull_options = pull_options or PullOptions()
    request = _Request(dest, config_options or ConfigOptions(), on_layer, link, keep_snapshot,
                       on_config)
    own = InUse(store.root) if in_use is None else None
    lease = in_use or own
    assert lease is not None
    with own or contextlib.nullcontext():
        run = PullRun(source, store, dataclasses.replace(pull_options, max_size=None),
                      progress or NO_PROGRESS, in_use=lease)
        result = _make_bundle(run, lease, request)
        if request.dest is None:  # a bundle in the cache, made or reused: its last use
            usage.touch(store.root, "bundle", result.path.name)
        if pull_options.max_size is not None:
            # only with a budget: ocistage.cache.gc and ocistage.cache.inventory are not needed
            # otherwise
            from ocistage.cache.gc import enforce_budget

            warnings = enforce_budget(store, pull_options.max_size, lease.targets)
            result = dataclasses.replace(result, warnings=result.warnings + warnings)
    return result


@dataclass(frozen=True)
class _Request:
    """What :func:`make_bundle` was asked to make, beside the pull (see its docstring)."""

    dest: Path | None
    config_options: ConfigOptions
    on_layer: Callable[[int, Descriptor], None] | None
    link: bool
    keep_snapshot: bool
    on_config: Callable[[Digest], None] | None = None


def _make_bundle(run: PullRun, in_use: InUse, request: _Request) -> BundleResult:
    """The bundle of ``request`` made while ``run`` (leased by ``in_use``) pulls."""
    puller = PullThread(run)
    try:
        return _build(puller, run, in_use, request)
    except KeyboardInterrupt:
        puller.canceller.cancel()  # downloads stop now and keep what they wrote
        # a connect in progress is left behind (ocistage.bundler.cli.app.main)
        puller.stop(CANCEL_GRACE)
        raise interrupted(run.store) from None
    except Exception:
        with contextlib.suppress(BaseException):
            puller.result()  # let the downloads finish into the cache; report our error
        raise


def _reused(puller: PullThread, store: Store, dest: Path) -> BundleResult:
    """The cached bundle already at ``dest``, once the pull is done."""
    image = puller.result()
    if not store.group_shared:
        with contextlib.suppress(OSError):
            make_private(dest)  # one made before bundles were kept private
    return BundleResult(dest, image, reused=True, warnings=image.warnings)


def _build(puller: PullThread, run: PullRun, in_use: InUse,
           request: _Request) -> BundleResult:
    store = run.store
    manifest_digest, layers, diff_ids, raw_config = puller.config()
    if request.on_config is not None:
        request.on_config(manifest_digest)
    key, dest, link = None, request.dest, request.link
    owners, notices = _owners(request.config_options)
    if dest is None:
        key = _bundle_key(manifest_digest, request.config_options, owners)
        in_use.protect([f"bundle:{key}"])
        dest = store.root / "bundles" / key
        if (dest / "config.json").is_file():
            return _reused(puller, store, dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        link = True
    else:
        dest = dest.absolute()
        _make_parents(dest)
        check_shared_parent(dest.parent, "destination directory", group_shared=True)
        _check_destination(dest)
    scratch = None
    published = False
    try:
        scratch = _scratch_beside(dest, key is not None)
        # the unpacking modules only now: a cached bundle found above never needs them
        from ocistage.bundler.rootfs import RootfsJob, make_rootfs
        from ocistage.cache.snapshots import strip_for_group

        job = RootfsJob(store, in_use, puller, layers, diff_ids, run.options.unpack_limit,
                        request.on_layer, owners)
        applied, snapshot, link = make_rootfs(job, scratch, link=link,
                                              keep_snapshot=request.keep_snapshot)
        image = puller.result()  # every blob verified before anything is published
        _write_config(scratch, raw_config, request.config_options, link)
        if key is not None:
            write_bundle_info(scratch, image.manifest.digest, image.name)
        if key is not None and not owners:
            # a private copy (cp could not link) or a snapshot of before the stripping
            notices += strip_for_group(store, scratch / "rootfs")
        # the image's setuid files and capabilities: nobody else may reach them (docs/trust.md),
        # nor, in a tree with the image's owners, the files that belong to other host users
        shared = key is not None and not owners
        mode = store.tree_dir_mode() if shared else PRIVATE_DIR_MODE
        applied = dataclasses.replace(applied, warnings=applied.warnings + notices)
        published = _publish(scratch, dest, key, mode)
    finally:
        if scratch is not None and not published:  # failed, or another process was first
            with contextlib.suppress(OSError):
                remove_tree(scratch)
    if not published:
        assert key is not None  # only a cached bundle is taken from another process
        return _reused(puller, store, dest)
    return BundleResult(dest, image, reused=False, warnings=image.warnings + applied.warnings,
                        layers_applied=applied.layers, snapshot=snapshot)


def run_notices(bundle: Path) -> tuple[Notice, ...]:
    """What keeps the caller from running ``bundle`` (made by :func:`make_bundle`) with a
    runtime here (:func:`ocistage.runtimes.userrun.user_run_notices`): said by ``ocistage
    bundle``, whose user runs the bundle, not by the commands that hand it to Slurm."""
    from ocistage.runtimes.userrun import user_run_notices

    try:
        config = parse_json(read_document(bundle / "config.json", owners="ours"))
    except (OSError, ValueError, OcistageError):
        return ()  # a bundle that cannot be read says so when it is run
    return user_run_notices(config, bundle) if isinstance(config, dict) else ()


def _owners(options: ConfigOptions,
            euid: int | None = None) -> tuple[bool, tuple[Notice, ...]]:
    """Whether the rootfs gets the image's owners (and device nodes): a config without a user
    namespace (``--no-rootless``) made by root, for a privileged runtime that runs the image
    user as itself. Anyone else cannot ``chown``: the files stay the caller's, with a warning
    saying what that means. ``euid``: the caller's (default: this process's)."""
    if options.rootless:
        return False, ()
    if (os.geteuid() if euid is None else euid) == 0:
        return True, ()
    return False, (Notice(Kind.OWNERS, (
        "--no-rootless without root: the image's owners cannot be restored, every file of "
        "the rootfs is yours, so under a privileged runtime an image user other than you "
        "cannot write its HOME or WORKDIR; make the bundle as root for the image's owners, "
        "or leave out --no-rootless")),)


def _write_config(scratch: Path, raw_config: bytes, options: ConfigOptions,
                  link: bool) -> None:
    """``scratch/config.json`` for the rootfs made there (``link``: sharing the cache's
    files), and the mount points it names made in that rootfs, so that runtimes starting the
    bundle at once on many nodes have none to make."""
    # only for a bundle being made: one found in the cache needs neither
    from ocistage.bundler.rootfsmounts import make_mount_points
    from ocistage.bundler.runtime_config import build_runtime_config, write_runtime_config

    shared_root = link and not options.readonly
    if link:
        # the rootfs shares file inodes with the cache's snapshot: a container writing
        # into its root would change the cache and every other bundle linked to it
        options = dataclasses.replace(options, readonly=True)
    config = build_runtime_config(json.loads(raw_config), scratch / "rootfs", options)
    try:
        make_mount_points(scratch / "rootfs", config["mounts"])
    except OSError as exc:
        raise StoreError(f"cannot make the mount points of the bundle in {scratch}: "
                         f"{exc.strerror}") from exc
    if shared_root:  # read-only for the sharing only: a private copy may be writable
        config.setdefault("annotations", {})[SHARED_ROOT_ANNOTATION] = "true"
    write_runtime_config(scratch, config)


def _publish(scratch: Path, dest: Path, key: str | None, mode: int) -> bool:
    """Rename ``scratch`` (made ``mode`` first) to ``dest``; False: the cached bundle ``key``
    was published there by another process first (``scratch`` is left to the caller)."""
    os.chmod(scratch, mode)
    try:
        # replaces an empty directory the user made for us, atomically; a filled one is
        # refused (ENOTEMPTY), so of several commands bundling into one DEST the first
        # to publish wins and the others fail cleanly
        os.rename(scratch, dest)
    except OSError as exc:
        if key is not None and (dest / "config.json").is_file():
            return False  # another process published the same cached bundle first: theirs
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise UsageError(f"{dest} was filled or replaced by another process while "
                             f"this bundle was made; nothing was written to it",
                             "bundle into a destination of its own") from exc
        raise StoreError(f"cannot publish the bundle at {dest}: {exc.strerror}") from exc
    fsync_dir(dest.parent)
    return True
