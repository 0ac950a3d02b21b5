"""The cache a get pulls an image into and takes its rootfs from, under one lease from the pull
until mksquashfs has read the rootfs.

The lease: another member's gc of a group-shared cache evicted the image's blobs between the
pull and the build, and could evict the cached bundle from under mksquashfs (the endurance
test).

With ``pyxis_squashfs_only`` (docs/pyxis.md) a get that recorded the reference in the cache
drops it again once the image is made, and with it the blobs only it used
(:meth:`CacheSource.drop_pulled`, :mod:`ocistage.cache.forget`): what others hold stays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.bundler.errors import PyxisImportError
from ocistage.bundler.image.reference import RegistryReference
from ocistage.cache.digest import Digest
from ocistage.cache.leases import InUse
from ocistage.cache.store import Store
from ocistage.stagers.squashfs_compression import Compression

if TYPE_CHECKING:
    from ocistage.bundler.flows.bundle import BundleResult
    from ocistage.bundler.pull import PullOptions


@dataclass(frozen=True)
class CacheSource:
    """The cache (``store``, opened once for the get), pulled into with ``options`` (the
    settings' pull options)."""

    store: Store
    options: PullOptions
    squashfs_only: bool = False   # drop what a get pulled once its image is made
    compression: Compression | None = None  # of the images a get makes (pyxis_compression)

    @contextlib.contextmanager
    def leased(self) -> Iterator[LeasedCache]:
        """The cache, opened, under one lease of this process until the block ends."""
        with InUse(self.store.root) as in_use:
            yield LeasedCache(self.store, self.options, in_use)

    def drop_pulled(self, reference: RegistryReference) -> None:
        """With ``squashfs_only``, drop the reference's record in the cache (made by this get:
        see :meth:`LeasedCache.recorded`) and the blobs only it used
        (:func:`ocistage.cache.forget.forget`): blobs another reference uses or a live lease
        names (a bundle or pull running) stay, and so does the reference while a lease names
        it. Best effort, after the lease of the get has ended: an image made is never failed
        for it (a gc holding the cache over 10 s, a full disk that takes no new index.json:
        the ref stays, for a later ``cache gc`` to evict)."""
        if not self.squashfs_only:
            return
        from ocistage.bundler.pull import ref_name
        from ocistage.cache.forget import forget
        from ocistage.errors import OcistageError

        with contextlib.suppress(OcistageError, OSError):
            forget(self.store, ref_name(reference))


@dataclass(frozen=True)
class LeasedCache:
    """The cache (``store``) while ``in_use`` holds what a get pulls and bundles from it."""

    store: Store
    options: PullOptions
    in_use: InUse

    def recorded(self, reference: RegistryReference) -> bool:
        """Whether the cache records ``reference`` (an ``ocistage pull`` or ``bundle`` of
        it, or an earlier get that kept it)."""
        from ocistage.bundler.pull import ref_name

        return bool(self.store.lookup(ref_name(reference)))

    def bundle(self, reference: RegistryReference, dest: Path,
               on_config: Callable[[Digest], None]) -> tuple[BundleResult, dict[str, Any]]:
        """Pull ``reference`` as ``ocistage pull`` does (no cache budget: a GC during a job's
        start would only slow it) and make a bundle of it at ``dest``, a scratch path of the
        caller's, while the layers download; its image config. ``on_config(manifest)`` is
        called before anything is unpacked (it raises to stop there: the pull completes).

        Not the cached bundle: what a squashfs is built from is not kept once it is built
        (an image costs its blobs and its squashfs, docs/pyxis.md). The layers are unpacked
        straight into ``dest``, or copied from the image's snapshot where ``ocistage bundle``
        in this cache keeps one (which stays). A refusal of the policy ``never`` says how to
        change it where pyxis users can (no ``--pull`` here)."""
        from ocistage.bundler.errors import SourceError
        from ocistage.bundler.flows.bundle import make_bundle

        try:
            bundle = make_bundle(reference, self.store, dest, in_use=self.in_use,
                                 pull_options=dataclasses.replace(self.options, max_size=None),
                                 on_config=on_config)
        except SourceError as exc:
            if self.options.policy != "never":
                raise
            raise PyxisImportError(
                f"{exc.message}, and the pull policy is never",
                "pull it first (`ocistage pull` with the job's cache), or unset OCISTAGE_PULL "
                "(or `pull` in the config file): the importer's default is missing") from exc
        config = json.loads(self.store.read_blob(bundle.image.config_digest))
        return bundle, config if isinstance(config, dict) else {}
