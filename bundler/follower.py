"""Following blobs while they download, so that layers are unpacked as they arrive.

:class:`PullThread` runs ``pull()`` in a thread that
reports its progress to a :class:`BlobFollower`, and readers (the layer unpacking of
:mod:`ocistage.bundler.unpack.layerchain`) read a blob's growing file as it is written, or the
stored blob once
it is complete. :meth:`PullThread.config` returns as soon as the pull has the image config,
while the layers may still be downloading.

If a download starts over (the server ignored ``Range``, or the blob failed verification),
the bytes a reader has already seen may not be the blob's: the reader raises
:class:`StreamRestarted`, and the caller starts again from the verified blobs.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ocistage.bundler.image.manifest import Descriptor, ImageConfig
from ocistage.bundler.pull import PulledImage, PullRun, run_pull
from ocistage.bundler.registry.types import BlobSink
from ocistage.cache.digest import Digest
from ocistage.cache.ingest import Ingest
from ocistage.cache.store import Store
from ocistage.errors import OcistageError

CHUNK = 1 << 20


class StreamRestarted(OcistageError):
    """A layer's download started over while it was being unpacked (internal: retried)."""


class PullFailed(OcistageError):
    """The pull stopped before the config was known (internal: the pull's error is raised)."""


@dataclass
class _Blob:
    partial: Path | None = None
    generation: int = 0        # bumped when written bytes are discarded
    done: bool = False


@dataclass
class BlobFollower:
    """A :class:`ocistage.bundler.pull.PullObserver` that lets readers follow blobs as they
    download."""

    store: Store
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _blobs: dict[Digest, _Blob] = field(default_factory=dict)
    _config: tuple[Digest, ImageConfig, tuple[Descriptor, ...]] | None = None
    _stopped: bool = False

    # -- the pull's side ---------------------------------------------------------------------

    def config_ready(self, manifest_digest: Digest, config: ImageConfig,
                     layers: tuple[Descriptor, ...]) -> None:
        with self._cond:
            self._config = (manifest_digest, config, layers)
            self._cond.notify_all()

    def sink(self, digest: Digest, ingest: Ingest) -> BlobSink:
        with self._cond:
            blob = self._blobs.setdefault(digest, _Blob())
            blob.partial = ingest.partial
            blob.done = False
            self._cond.notify_all()
        return _TeeSink(self, digest, ingest)

    def finished(self, digest: Digest, ok: bool) -> None:
        with self._cond:
            blob = self._blobs.setdefault(digest, _Blob())
            if ok:
                blob.done = True
            else:
                blob.generation += 1
                blob.partial = None
            self._cond.notify_all()

    def wrote(self, digest: Digest, restarted: bool = False) -> None:
        with self._cond:
            if restarted:
                self._blobs[digest].generation += 1
            self._cond.notify_all()

    def discarded(self) -> bool:
        """Whether any download started over (bytes a reader may have seen were dropped)."""
        with self._cond:
            return any(blob.generation for blob in self._blobs.values())

    def stop(self) -> None:
        """The pull ended (successfully or not): nothing more will arrive."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    # -- the reader's side -------------------------------------------------------------------

    def wait_config(self) -> tuple[Digest, ImageConfig, tuple[Descriptor, ...]]:
        with self._cond:
            while self._config is None:
                if self._stopped:
                    raise PullFailed("the pull ended before the image config was known")
                self._cond.wait()
            return self._config

    def open(self, digest: Digest) -> BinaryIO:
        """The blob's bytes: from the store once published, else following its download."""
        with self._cond:
            while True:
                blob = self._blobs.get(digest)
                if blob is not None and blob.done:
                    return self.store.open_blob(digest)
                if blob is not None and blob.partial is not None:
                    try:
                        file = open(blob.partial, "rb")  # noqa: SIM115 - owned by the reader
                    except FileNotFoundError:
                        if self.store.has_blob(digest):  # committed just now
                            return self.store.open_blob(digest)
                        self._cond.wait(timeout=0.1)
                        continue
                    return _FollowingReader(self, digest, blob.generation, file)  # type: ignore[return-value]
                if self._stopped:
                    raise StreamRestarted(f"blob {digest.short} was not downloaded")
                self._cond.wait()

    def check(self, digest: Digest, generation: int) -> None:
        """Raise if the bytes of ``digest`` were discarded since a reader started."""
        with self._cond:
            if self._blobs[digest].generation != generation:
                raise StreamRestarted(f"the download of {digest.short} started over")

    def wait_more(self, digest: Digest, generation: int) -> bool:
        """Block until more bytes may be there; ``False`` once the blob is complete."""
        with self._cond:
            blob = self._blobs[digest]
            if blob.generation != generation:
                raise StreamRestarted(f"the download of {digest.short} started over")
            if blob.done:
                return False
            if self._stopped:
                raise StreamRestarted(f"the download of {digest.short} stopped")
            self._cond.wait(timeout=0.5)
            return True


@dataclass
class _TeeSink:
    """The ingest, telling the follower about each write (readers then read the file)."""

    follower: BlobFollower
    digest: Digest
    ingest: Ingest

    @property
    def offset(self) -> int:
        return self.ingest.offset

    def write(self, chunk: bytes) -> None:
        self.ingest.write(chunk)
        self.follower.wrote(self.digest)

    def restart(self) -> None:
        self.ingest.restart()
        self.follower.wrote(self.digest, restarted=True)


class _FollowingReader:
    """Reads a partial blob file while it is being written; EOF once the blob is complete."""

    def __init__(self, follower: BlobFollower, digest: Digest, generation: int,
                 file: BinaryIO) -> None:
        self._follower = follower
        self._digest = digest
        self._generation = generation
        self._file = file

    def read(self, size: int = -1) -> bytes:
        size = CHUNK if size is None or size < 0 else size
        while True:
            data = self._file.read(size)
            if data:
                self._follower.check(self._digest, self._generation)
                return data
            if not self._follower.wait_more(self._digest, self._generation):
                return self._file.read(size)  # the last bytes, flushed at commit

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> _FollowingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PullThread:
    """``pull()`` of a :class:`ocistage.bundler.pull.PullRun` running beside the unpacking,
    reporting to a :class:`BlobFollower`: :meth:`open` reads a layer as it downloads."""

    def __init__(self, run: PullRun) -> None:
        self._follower = BlobFollower(run.store)
        self.canceller = run.canceller
        self._image: PulledImage | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(dataclasses.replace(run, observer=self._follower),),
            name="pull", daemon=True)
        self._thread.start()

    def _run(self, run: PullRun) -> None:
        try:
            self._image = run_pull(run)
        except BaseException as exc:
            self._error = exc
        finally:
            self._follower.stop()

    def stop(self, grace: float) -> None:
        """Wait at most ``grace`` seconds for a cancelled pull to end."""
        self._thread.join(grace)

    def result(self) -> PulledImage:
        """The pulled image once every blob is verified and stored; the pull's error if not."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._image is not None
        return self._image

    def config(self) -> tuple[Digest, tuple[Descriptor, ...], tuple[Digest, ...], bytes]:
        try:
            manifest_digest, config, layers = self._follower.wait_config()
        except PullFailed:
            self.result()  # raises the pull's own error
            raise
        return manifest_digest, layers, config.diff_ids, config.raw

    def open(self, digest: Digest) -> BinaryIO:
        """A blob's bytes, following its download (:meth:`BlobFollower.open`)."""
        return self._follower.open(digest)

    def restarted(self) -> bool:
        """Whether any download started over (:meth:`BlobFollower.discarded`)."""
        return self._follower.discarded()
