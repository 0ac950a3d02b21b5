"""One blob being written into the store (:class:`Ingest`): resumable across processes and
crashes, verified against its digest before it is published by rename.

The partial download lies at ``CACHE/ingest/<hex>.partial`` under the blob's lock
(:meth:`ocistage.cache.store.Store.ingest`); :func:`open_ingest` resumes a partial file of the
caller's and replaces anything else planted at its name, never writing through it.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ocistage.cache.atomicwrite import fsync_dir
from ocistage.cache.digest import Digest
from ocistage.cache.errors import TAMPERED_HINT, translate_oserror
from ocistage.errors import IntegrityError

CHUNK = 1 << 20
_PARTIAL_FLAGS = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Ingest:
    """One blob being written into the store; resumable across processes and crashes."""

    digest: Digest
    size: int | None
    partial: Path
    final: Path
    _file: BinaryIO
    _hasher: Any = field(repr=False)
    _offset: int = 0

    @property
    def offset(self) -> int:
        return self._offset

    def write(self, chunk: bytes) -> None:
        if self.size is not None and self._offset + len(chunk) > self.size:
            raise IntegrityError(
                f"blob {self.digest} is larger than its declared size {self.size}")
        try:
            self._file.write(chunk)
        except OSError as exc:
            raise translate_oserror(exc, f"writing blob {self.digest.short}") from exc
        self._hasher.update(chunk)
        self._offset += len(chunk)

    def close(self) -> None:
        self._file.close()

    def restart(self) -> None:
        self._file.seek(0)
        self._file.truncate()
        self._hasher = self.digest.hasher()
        self._offset = 0

    def commit(self) -> Path:
        """Verify size and digest, make the blob durable and publish it by rename."""
        if self.size is not None and self._offset != self.size:
            raise IntegrityError(
                f"blob {self.digest} has {self._offset} bytes, expected {self.size}")
        actual = self._hasher.hexdigest()
        if actual != self.digest.hex:
            self.restart()
            raise IntegrityError(
                f"blob {self.digest} has digest {self.digest.algorithm}:{actual}")
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            os.fchmod(self._file.fileno(), 0o444)
            os.rename(self.partial, self.final)
            ours = os.fstat(self._file.fileno())
            published = os.lstat(self.final)
            if (published.st_dev, published.st_ino) != (ours.st_dev, ours.st_ino):
                # the name was swapped under us (a group-writable ingest/): not our bytes
                _remove_planted(self.final)
                raise IntegrityError(f"the download of blob {self.digest} was replaced by "
                                     f"another file while being published", TAMPERED_HINT)
            fsync_dir(self.final.parent)
        except OSError as exc:
            raise translate_oserror(exc, f"publishing blob {self.digest.short}") from exc
        return self.final


def open_ingest(ingest_dir: Path, digest: Digest, size: int | None, final: Path) -> Ingest:
    """Blob ``digest``'s partial download in ``ingest_dir``, to append to: ours to resume,
    or a new one.

    Anything else at its name (a symbolic link, another user's file or a directory,
    planted in a group-writable ``ingest/``) is removed and replaced, never written
    through: the caller holds the blob's lock, so no live download of ours is there.
    """
    partial = ingest_dir / f"{digest.hex}.partial"
    try:
        fd = _open_own_partial(partial)
    except OSError as exc:
        raise translate_oserror(exc, f"opening {partial}") from exc
    file = os.fdopen(fd, "a+b")
    hasher = digest.hasher()
    file.seek(0)
    offset = 0
    # resume: re-hash what a previous (crashed or interrupted) attempt left
    while chunk := file.read(CHUNK):
        hasher.update(chunk)
        offset += len(chunk)
    ingest = Ingest(digest, size, partial, final, file, hasher, offset)
    if size is not None and offset > size:
        ingest.restart()
    return ingest


def _open_own_partial(partial: Path) -> int:
    """An fd of ``partial`` that is a regular file of this user, else of a new empty one."""
    for _ in range(3):
        try:
            fd = os.open(partial, _PARTIAL_FLAGS | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            pass
        else:
            return fd
        try:
            fd = os.open(partial, _PARTIAL_FLAGS)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EACCES):
                raise
        else:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                return fd
            os.close(fd)
        _remove_planted(partial)
    raise OSError(errno.EEXIST, "keeps being replaced by someone else", str(partial))


def _remove_planted(path: Path) -> None:
    """Unlink what someone else put at ``path`` (an empty directory at most)."""
    try:
        os.unlink(path)
    except IsADirectoryError:
        os.rmdir(path)
    except FileNotFoundError:
        pass
