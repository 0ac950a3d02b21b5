"""Make an image: the image's rootfs in a scratch directory of the cache (removed once read),
the files enroot writes into it, mksquashfs in a scratch directory of the store, then publish
it."""

from __future__ import annotations

import time
from pathlib import Path

from ocistage.bundler.errors import PyxisImportError
from ocistage.bundler.image.reference import RegistryReference
from ocistage.bundler.pyxis.cachesource import LeasedCache
from ocistage.bundler.pyxis.enroot_files import enroot_files
from ocistage.bundler.pyxis.imagekey import IMAGE_FORMAT
from ocistage.bundler.pyxis.imagestore import ImageStore
from ocistage.bundler.pyxis.mksquashfs import Mksquashfs, mksquashfs_argv, run_mksquashfs
from ocistage.cache.cpus import usable_cpus
from ocistage.cache.errors import StoreError
from ocistage.cache.pyxisimages import IMAGE_SUFFIX
from ocistage.stagers.errors import PseudoNameError


def build(reference: RegistryReference, source: LeasedCache, images: ImageStore, key: str,
          mksquashfs: Mksquashfs, manifest: str) -> Path:
    """Make image ``key`` of ``reference`` (pulled already into ``source``, as ``manifest``)
    and publish it in ``images``."""
    work = source.store.temp_dir("pyxis-rootfs")
    try:
        return _build(reference, source, images, key, mksquashfs, manifest, work)
    finally:
        source.store.remove_temp_dir(work)


def _build(reference: RegistryReference, source: LeasedCache, images: ImageStore, key: str,
           mksquashfs: Mksquashfs, manifest: str, work: Path) -> Path:
    """:func:`build` with the image's rootfs made in ``work`` (a scratch dir of the cache,
    removed by the caller once mksquashfs has read it)."""
    bundle, config = source.bundle(reference, manifest, work / "bundle")
    files, workdir = enroot_files(config, str(reference))
    store = images.store
    scratch = store.temp_dir("pyxis")
    try:
        written = {}
        for n, (inside, data) in enumerate(sorted(files.items())):
            written[inside] = scratch / f"file{n}"
            written[inside].write_bytes(data)
        built = scratch / f"{key}{IMAGE_SUFFIX}"
        try:
            argv = mksquashfs_argv(mksquashfs.path, bundle.path / "rootfs", built, written,
                                   workdir, mksquashfs.compression, usable_cpus())
        except PseudoNameError as exc:
            raise PyxisImportError(f"{reference}: its config's WorkingDir {workdir!r} cannot be "
                                   f"made in the image: {exc.message}",
                                   "fix the image's WorkingDir (a plain absolute path)") from exc
        run_mksquashfs(argv, store.root)
        record = {"source": str(reference), "manifest": manifest,
                  "platform": str(bundle.image.platform), "compressor": mksquashfs.compressor,
                  "compression": str(mksquashfs.compression), "format": IMAGE_FORMAT,
                  "created": time.time()}
        return images.publish(built, key, record)
    except OSError as exc:
        raise StoreError(f"cannot make the image of {reference} in {store.root}: "
                         f"{exc.strerror}") from exc
    finally:
        store.remove_temp_dir(scratch)
