"""Make an image while its layers download, once the pull has resolved its manifest (its key).

If no store has that image yet, the layers are unpacked into a scratch directory of the cache
as they arrive (removed once read), the files enroot writes are added, mksquashfs runs in a
scratch directory of the store, and the image is published."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.bundler.errors import PyxisImportError
from ocistage.bundler.image.reference import RegistryReference
from ocistage.bundler.pyxis.cachesource import LeasedCache
from ocistage.bundler.pyxis.enroot_files import enroot_files
from ocistage.bundler.pyxis.imagekey import IMAGE_FORMAT, image_key
from ocistage.bundler.pyxis.imagestore import ImageStore
from ocistage.bundler.pyxis.jobstep import JobStep
from ocistage.bundler.pyxis.mksquashfs import Mksquashfs, mksquashfs_argv, run_mksquashfs
from ocistage.bundler.pyxis.sitestore import SiteStore
from ocistage.cache.cpus import usable_cpus
from ocistage.cache.digest import Digest
from ocistage.cache.errors import StoreError
from ocistage.cache.pyxisimages import IMAGE_SUFFIX
from ocistage.stagers.errors import PseudoNameError

if TYPE_CHECKING:
    from ocistage.bundler.flows.bundle import BundleResult


@dataclass
class Made:
    """The image of a reference as the registry has it now: its path, whether this call
    built it, whether it is the site store's, its manifest and key."""

    path: Path
    built: bool
    site: bool
    manifest: str
    key: str


class _Found(Exception):
    """The image of the resolved manifest is in a store already: nothing to unpack."""


def obtain(reference: RegistryReference, source: LeasedCache, site: SiteStore | None,
           images: ImageStore, step: JobStep, mksquashfs: Mksquashfs) -> Made:
    """Pull ``reference`` into ``source`` and return its image: the site store's, else the
    one in ``images`` (leased to ``step``), built there under the key's lock if it is missing.

    The key is known once the pull has resolved the manifest; the layers are unpacked while
    they download (:func:`ocistage.bundler.flows.bundle.make_bundle`), not after. When the
    image is there already, nothing is unpacked (the pull still completes, as ``ocistage
    pull`` would)."""
    work = source.store.temp_dir("pyxis-rootfs")
    made: list[Made] = []
    try:
        with contextlib.ExitStack() as held:
            def decide(manifest: Digest) -> None:
                """Under the key's lock, whether to build (return) or not (raise)."""
                key = image_key(str(manifest), mksquashfs.compressor)
                shared = site.image(key) if site is not None else None
                if shared is not None:
                    made.append(Made(shared, False, True, str(manifest), key))
                    raise _Found
                slot = held.enter_context(images.building(key, step))
                made.append(Made(slot.path, slot.missing, False, str(manifest), key))
                if not slot.missing:  # built meanwhile by whoever held the lock
                    raise _Found

            try:
                bundle, config = source.bundle(reference, work / "bundle", decide)
            except _Found:
                return made[0]
            _squash(reference, bundle, config, images, made[0], mksquashfs)
            return made[0]
    finally:
        source.store.remove_temp_dir(work)


def _squash(reference: RegistryReference, bundle: BundleResult, config: dict[str, Any],
            images: ImageStore, made: Made, mksquashfs: Mksquashfs) -> Path:
    """mksquashfs of the bundle's rootfs with the files enroot writes, in a scratch directory
    of the store, published as image ``made.key``."""
    files, workdir = enroot_files(config, str(reference))
    store = images.store
    scratch = store.temp_dir("pyxis")
    try:
        written = {}
        for n, (inside, data) in enumerate(sorted(files.items())):
            written[inside] = scratch / f"file{n}"
            written[inside].write_bytes(data)
        built = scratch / f"{made.key}{IMAGE_SUFFIX}"
        try:
            argv = mksquashfs_argv(mksquashfs.path, bundle.path / "rootfs", built, written,
                                   workdir,
                                   mksquashfs.compression, usable_cpus())
        except PseudoNameError as exc:
            raise PyxisImportError(f"{reference}: its config's WorkingDir {workdir!r} cannot be "
                                   f"made in the image: {exc.message}",
                                   "fix the image's WorkingDir (a plain absolute path)") from exc
        run_mksquashfs(argv, store.root)
        record = {"source": str(reference), "manifest": made.manifest,
                  "platform": str(bundle.image.platform), "compressor": mksquashfs.compressor,
                  "compression": str(mksquashfs.compression), "format": IMAGE_FORMAT,
                  "created": time.time()}
        return images.publish(built, made.key, record)
    except OSError as exc:
        raise StoreError(f"cannot make the image of {reference} in {store.root}: "
                         f"{exc.strerror}") from exc
    finally:
        store.remove_temp_dir(scratch)
