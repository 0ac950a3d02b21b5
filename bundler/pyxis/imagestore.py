"""A store's squashfs images (``STORE/pyxis``): its trusted directories, the image of each
key, built once under the key's lock and published by one ``rename()``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ocistage.bundler.pyxis.jobstep import JobStep
from ocistage.cache.errors import LockTimeout, StoreError
from ocistage.cache.locks import FileLock
from ocistage.cache.pyxisimages import IMAGE_DIR, image_path_at, touch
from ocistage.cache.store import Store, fsync_dir

#: bump when what goes into an image changes (the files of enroot_files, mksquashfs options)
IMAGE_FORMAT = 2
#: how long a get waits for another process building the same image
BUILD_WAIT = 3 * 3600.0


def image_key(manifest_digest: str, compressor: str) -> str:
    """The key of an image: its manifest (one per platform), format and compressor."""
    shape = {"format": IMAGE_FORMAT, "manifest": manifest_digest, "compressor": compressor}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def present(path: Path) -> bool:
    """Whether an image (a regular file, never a link) is at ``path``."""
    try:
        return os.path.isfile(path) and not os.path.islink(path)
    except OSError:
        return False


class ImageStore:
    """The images of one store this user writes (the cache, or the site's ``pyxis_store``)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @classmethod
    def open(cls, root: Path) -> ImageStore:
        return cls(Store.open(root))

    @property
    def root(self) -> Path:
        return self.store.root

    def path(self, key: str) -> Path:
        return image_path_at(self.store.root, key)

    def directory(self, *parts: str) -> Path:
        """``STORE/pyxis`` (or a directory below it), made if missing as the store's own
        directories are (the umask decides: ``002`` keeps a group-shared store writable by
        the group, and the setgid bit is inherited), and checked against the trust rule as
        they are (docs/trust.md): the caller's or root's and not writable by others, or, in a
        group-shared store, a setgid directory of the caller's group. Never a symlink."""
        from ocistage.cache.fsops import check_trusted_dir

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
        lock = FileLock(self.directory() / f"{key}.lock")
        try:
            lock.acquire(timeout=wait, poll=0.5)
        except LockTimeout as exc:
            raise LockTimeout(f"another process has been building image {key[:12]} for "
                              f"{int(wait)} s", "retry the job later") from exc
        try:
            yield
        finally:
            lock.release()

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

    def provide(self, key: str, step: JobStep,
                make: Callable[[], object]) -> tuple[Path, bool]:
        """Image ``key``, leased to ``step``; ``make()`` builds and publishes it when it is
        missing, under the key's lock, so that of all the processes asking at once one builds
        and the others wait and reuse it. Returns the path and whether this call built it."""
        step.hold(self.store.root, key)
        self.directory()  # an image is looked for only in a trusted directory
        final = self.path(key)
        if present(final):
            return final, False
        with self.build_lock(key):
            if present(final):  # built by whoever held the lock before us
                return final, False
            make()
        if not present(final):
            raise StoreError(f"image {key[:12]} was built but is not at {final}")
        return final, True

    def touch(self, key: str) -> None:
        """Record a use of image ``key`` now."""
        touch(self.store.root, key)
