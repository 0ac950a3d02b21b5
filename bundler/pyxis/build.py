"""Make an image from the cache: the image's rootfs (the cached bundle), the files enroot
writes into it, mksquashfs in a scratch directory of the store, then publish it."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ocistage.bundler.errors import PyxisImportError
from ocistage.bundler.image.reference import RegistryReference
from ocistage.bundler.pyxis.enroot_files import enroot_files
from ocistage.bundler.pyxis.imagestore import IMAGE_FORMAT, ImageStore
from ocistage.bundler.pyxis.mksquashfs import Mksquashfs, mksquashfs_argv, run_mksquashfs
from ocistage.cache.cpus import usable_cpus
from ocistage.cache.errors import StoreError
from ocistage.cache.leases import InUse
from ocistage.cache.pyxisimages import IMAGE_SUFFIX
from ocistage.cache.store import Store
from ocistage.stagers.errors import PseudoNameError

if TYPE_CHECKING:
    from ocistage.bundler.pull import PullOptions


def build(reference: RegistryReference, cache: Store, images: ImageStore, key: str,
          options: PullOptions, mksquashfs: Mksquashfs, manifest: str, in_use: InUse) -> Path:
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
                                   workdir, mksquashfs.compressor, usable_cpus())
        except PseudoNameError as exc:
            raise PyxisImportError(f"{reference}: its config's WorkingDir {workdir!r} cannot be "
                                   f"made in the image: {exc.message}",
                                   "fix the image's WorkingDir (a plain absolute path)") from exc
        run_mksquashfs(argv, store.root)
        record = {"source": str(reference), "manifest": manifest,
                  "platform": str(bundle.image.platform), "compressor": mksquashfs.compressor,
                  "format": IMAGE_FORMAT, "created": time.time()}
        return images.publish(built, key, record)
    except OSError as exc:
        raise StoreError(f"cannot make the image of {reference} in {store.root}: "
                         f"{exc.strerror}") from exc
    finally:
        store.remove_temp_dir(scratch)
