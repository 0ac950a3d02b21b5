"""``ocistage bundle``: a pulled image -> a runtime bundle (``rootfs/`` + ``config.json``).

The bundle is built in a scratch directory beside its destination and published by one
``rename()``: a crash leaves no half bundle at the final path. Each layer blob (already verified
against its digest by the pull) is decompressed and applied in order; the uncompressed stream is
hashed on the way and must equal the config's ``diff_id`` for that layer, or the bundle is
thrown away. ``config.json`` is generated from the image config and validated before it is
written.

Without DEST the bundle goes to ``CACHE/bundles/<key>``, keyed by the manifest digest and the
options that shape the bundle, so asking twice for the same bundle returns the existing one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from bundler.decompress import open_layer_stream
from bundler.layers import apply_layer
from bundler.manifest import Descriptor
from bundler.pull import PulledImage, PullOptions, PullProgress, pull
from bundler.reference import ImageSource
from bundler.runtime_config import ConfigOptions, build_runtime_config, write_runtime_config
from cache.digest import Digest
from cache.errors import IntegrityError, StoreError, UsageError
from cache.store import Store, fsync_dir, remove_tree

BUNDLE_FORMAT = 1  # bump when the bundle layout or config generation changes meaning
CHUNK = 1 << 20


@dataclass(frozen=True)
class BundleResult:
    path: Path
    image: PulledImage
    reused: bool                      # an identical bundle existed already
    warnings: tuple[str, ...] = ()


@dataclass
class _HashingReader:
    """Reads through ``raw`` while hashing what was read (the layer's diff_id)."""

    raw: BinaryIO
    hasher: Any = field(default_factory=hashlib.sha256)

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.hasher.update(data)
        return data

    def readinto(self, buffer: memoryview) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


def bundle_key(image: PulledImage, options: ConfigOptions) -> str:
    """The cache key of a bundle: manifest digest plus every option that changes the result."""
    shape = {"format": BUNDLE_FORMAT, "manifest": str(image.manifest.digest),
             "options": asdict(options)}
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()


def apply_image_layers(store: Store, layers: tuple[Descriptor, ...],
                       diff_ids: tuple[Digest, ...], rootfs: Path,
                       on_layer: Callable[[int, Descriptor], None] | None = None) -> list[str]:
    """Apply each layer blob onto ``rootfs`` in order, verifying every diff_id."""
    warnings: list[str] = []
    for n, (layer, diff_id) in enumerate(zip(layers, diff_ids, strict=True), start=1):
        if on_layer is not None:
            on_layer(n, layer)
        with store.open_blob(layer.digest) as blob:
            reader = _HashingReader(open_layer_stream(blob, layer.media_type))
            report = apply_layer(reader, rootfs)  # type: ignore[arg-type]
            reader.drain()
        actual = reader.hasher.hexdigest()
        if actual != diff_id.hex:
            raise IntegrityError(
                f"layer {n} ({layer.digest.short}) unpacks to sha256:{actual}, but the image "
                f"config says its diff_id is {diff_id}")
        warnings.extend(f"layer {n}: {w}" for w in report.warnings)
    return warnings


def _scratch_beside(dest: Path) -> Path:
    scratch = dest.parent / f".{dest.name}.ocistage-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        scratch.mkdir(mode=0o700)
    except OSError as exc:
        raise StoreError(f"cannot create {scratch}: {exc.strerror}",
                         "check that the destination's parent exists and is writable") from exc
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
) -> BundleResult:
    """Pull ``source`` (reusing the cache) and make a bundle at ``dest`` or in the cache."""
    config_options = config_options or ConfigOptions()
    image = pull(source, store, pull_options, progress)
    if dest is None:
        dest = store.root / "bundles" / bundle_key(image, config_options)
        if (dest / "config.json").is_file():
            return BundleResult(dest, image, reused=True, warnings=image.warnings)
        dest.parent.mkdir(parents=True, exist_ok=True)
    else:
        dest = dest.absolute()
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise UsageError(f"{dest} exists and is not an empty directory",
                             "choose a new destination, or remove it first")
    scratch = _scratch_beside(dest)
    try:
        rootfs = scratch / "rootfs"
        rootfs.mkdir(mode=0o755)
        warnings = apply_image_layers(store, image.layers, image.config.diff_ids, rootfs,
                                      on_layer)
        config = build_runtime_config(json.loads(image.config.raw), rootfs, config_options)
        write_runtime_config(scratch, config)
        os.chmod(scratch, 0o755)
        if dest.is_dir():
            dest.rmdir()  # an empty directory the user made for us
        try:
            os.rename(scratch, dest)
        except OSError as exc:
            if dest.exists() and (dest / "config.json").is_file():
                # another process published the same cached bundle first; use theirs
                remove_tree(scratch)
                return BundleResult(dest, image, reused=True, warnings=image.warnings)
            raise StoreError(f"cannot publish the bundle at {dest}: {exc.strerror}") from exc
        fsync_dir(dest.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            remove_tree(scratch)
        raise
    return BundleResult(dest, image, reused=False,
                        warnings=image.warnings + tuple(warnings))
