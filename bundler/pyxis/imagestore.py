"""A store's squashfs images (``STORE/pyxis``): its trusted directories, the image of each
key, built once under the key's lock and published by one ``rename()``."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ocistage.bundler.image.reference import RegistryReference
from ocistage.bundler.pyxis.jobstep import JobStep
from ocistage.bundler.pyxis.refnotes import Noted, recall, record_name, remember
from ocistage.cache.atomicwrite import fsync_dir
from ocistage.cache.errors import LockTimeout, StoreError
from ocistage.cache.locks import FileLock
from ocistage.cache.pyxisimages import (
    IMAGE_DIR,
    REFS_DIR,
    image_path_at,
    is_image,
    touch,
    unretire,
)
from ocistage.cache.store import Store

#: how long a get waits for another process building the same image
BUILD_WAIT = 3 * 3600.0
#: the nodes waiting for one that imports: every 20 ms for 3 s (a small image's build is
#: followed at once), then every 0.2 s (a large one's costs few ``lstat``s)
WAIT_BRISK = (3.0, 0.02)


@dataclass
class Slot:
    """An image asked for: its path, and whether the asker is to build it (it holds the key's
    lock then)."""

    path: Path
    missing: bool


@dataclass(frozen=True)
class ImageStore:
    """The images of the store at ``root``, which this user writes (the cache, or the site's
    ``pyxis_store``); the store is opened (made) when first used."""

    root: Path

    @functools.cached_property
    def store(self) -> Store:
        return Store.open(self.root)

    def path(self, key: str) -> Path:
        return image_path_at(self.store.root, key)

    def directory(self, *parts: str) -> Path:
        """``STORE/pyxis`` (or a directory below it), made if missing as the store's own
        directories are (the umask decides: ``002`` keeps a group-shared store writable by
        the group, and the setgid bit is inherited), and checked against the trust rule as
        they are (docs/trust.md): the caller's or root's and not writable by others, or, in a
        group-shared store, a setgid directory of the caller's group. Never a symlink."""
        from ocistage.cache.dirtrust import check_trusted_dir

        directory = self.store.root / IMAGE_DIR
        for part in ("", *parts):
            directory = directory / part if part else directory
            try:
                directory.mkdir(exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot make {directory}: {exc.strerror}") from exc
            check_trusted_dir(directory, "pyxis store directory", group_shared=True)
        return directory

    @contextlib.contextmanager
    def build_lock(self, key: str, wait: float = BUILD_WAIT) -> Iterator[None]:
        """The lock of building image ``key`` (one build; the others wait for it)."""
        with _held(FileLock(self.directory() / f"{key}.lock"), wait,
                   f"another process has been building image {key[:12]} for {int(wait)} s"):
            yield

    @contextlib.contextmanager
    def resolving(self, reference: RegistryReference,
                  wait: float = BUILD_WAIT) -> Iterator[bool]:
        """The lock of asking the registry what ``reference`` is and making its image: of all
        the nodes of a job asking at once, one asks (one manifest request per tag). True for
        the block of the one that took it; False, once that one is done, for the others, which
        waited without taking it and then find its note (:meth:`recalled`) and ask nothing."""
        name = record_name(reference).removesuffix(".json") + ".lock"
        lock = FileLock(self.directory(REFS_DIR) / name)
        if lock.try_acquire():
            try:
                yield True
            finally:
                lock.release()
            return
        try:
            lock.wait_released(timeout=wait, poll=0.2, brisk=WAIT_BRISK)
        except LockTimeout as exc:
            raise LockTimeout(f"another process has been importing {reference} for "
                              f"{int(wait)} s", "retry the job later") from exc
        yield False

    @contextlib.contextmanager
    def building(self, key: str, step: JobStep) -> Iterator[Slot]:
        """Image ``key``, leased to ``step``: a slot that says whether it is missing. Then the
        block builds and publishes it, under the key's lock, so that of all the processes
        asking at once one builds and the others wait and find it made."""
        step.hold(self.store.root, key)
        self.directory()  # an image is looked for only in a trusted directory
        unretire(self.store.root, key)  # leased now: the gc that retired it keeps it
        final = self.path(key)
        if is_image(final):
            yield Slot(final, missing=False)
            return
        with self.build_lock(key):
            slot = Slot(final, missing=not is_image(final))  # built by whoever held the lock
            yield slot
        if not is_image(final):
            raise StoreError(f"image {key[:12]} was built but is not at {final}")

    def publish(self, built: Path, key: str, record: Mapping[str, Any]) -> Path:
        """Move the finished image ``built`` to its key's path with its record beside it."""
        final = self.path(key)
        os.chmod(built, 0o644)
        info = built.with_name(built.name + ".json")
        info.write_text(json.dumps(dict(record), sort_keys=True) + "\n")
        os.chmod(info, 0o644)
        os.rename(info, final.with_suffix(".json"))
        os.rename(built, final)
        fsync_dir(final.parent)
        return final

    def remember(self, reference: RegistryReference, key: str, manifest: str) -> None:
        """Note that ``reference`` is image ``key`` (:mod:`~ocistage.bundler.pyxis.refnotes`)."""
        remember(self.directory(REFS_DIR), reference, key, manifest)

    def recalled(self, reference: RegistryReference, step: JobStep) -> Noted | None:
        """What ``reference`` resolved to before, if its image is here, leased to ``step``
        (and its use recorded)."""
        self.directory(REFS_DIR)  # notes and images: only from trusted directories
        found = recall(self.store.root, reference)
        if found is None:
            return None
        step.hold(self.store.root, found.key)
        if not is_image(self.path(found.key)):
            return None
        unretire(self.store.root, found.key)  # leased now: the gc that retired it keeps it
        self.touch(found.key)
        return found

    def touch(self, key: str) -> None:
        """Record a use of image ``key`` now."""
        touch(self.store.root, key)


@contextlib.contextmanager
def _held(lock: FileLock, wait: float, waited: str) -> Iterator[None]:
    """``lock`` held for the block, waited for up to ``wait`` seconds (polled twice a second:
    a waiter costs next to no CPU); ``waited`` says what took too long."""
    try:
        lock.acquire(timeout=wait, poll=0.5)
    except LockTimeout as exc:
        raise LockTimeout(waited, "retry the job later") from exc
    try:
        yield
    finally:
        lock.release()
