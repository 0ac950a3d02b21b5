"""``ocistage pull``: resolve a reference, pick a platform, fetch config and layers into the store.

The order of events is what keeps the cache consistent whatever happens:

1. resolve the reference to a manifest or index (verified against its digest);
2. for an index, choose the platform's manifest and fetch it (verified); then ask the image
   policy (:mod:`ocistage.bundler.trust`) whether that manifest may be used: a rejected image
   stops here, with nothing of it in the cache;
3. fetch the config, then the layers, in parallel, each through ``store.ingest`` (verified,
   resumable, never fetched twice, not even by another process sharing the cache);
4. store the manifest (and index) blobs, and only then point the reference at the manifest in
   ``index.json``.

A crash before step 4 leaves verified blobs and partial downloads, which the next pull reuses.

Before step 3 the pull records a lease (:class:`ocistage.cache.leases.InUse`) on the ref and every
blob it is about to use, so a concurrent ``cache gc`` cannot take them; afterwards it records the
image's last use (:mod:`ocistage.cache.usage`) and, with ``PullOptions.max_size``, GCs the cache
down to that budget without touching what it uses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ocistage.bundler.errors import SourceError
from ocistage.bundler.image.errors import SchemaError, UnsupportedManifest
from ocistage.bundler.image.manifest import (
    Descriptor,
    ImageConfig,
    ImageIndex,
    ImageManifest,
    parse_descriptor,
    parse_image_config,
    parse_manifest,
    select_manifest,
)
from ocistage.bundler.image.platform import Platform, host_platform, select_platform
from ocistage.bundler.image.reference import ImageSource
from ocistage.bundler.registry.types import BlobSink, FetchedManifest, RegistryConfig
from ocistage.bundler.settings import DEFAULT_JOBS
from ocistage.bundler.sources import ImageProvider, OciLayoutProvider, open_provider
from ocistage.bundler.trust.files import TrustConfig
from ocistage.cache import usage
from ocistage.cache.digest import Digest
from ocistage.cache.ingest import Ingest
from ocistage.cache.leases import InUse
from ocistage.cache.notice import Kind, Notice
from ocistage.cache.sizes import count, format_size
from ocistage.cache.store import Store
from ocistage.errors import IntegrityError, Interrupted, OcistageError

if TYPE_CHECKING:
    from ocistage.bundler.trust.check import TrustResult
    from ocistage.bundler.trust.evaluate import Verdict
    from ocistage.results import Renderer

ANNOTATION_RESOLVED = "io.ocistage.resolved"
ANNOTATION_INDEX = "io.ocistage.index-digest"
ANNOTATION_SOURCE = "io.ocistage.source"
#: seconds a Ctrl-C waits for downloads to stop (a socket shut down returns at once; a
#: connect in progress cannot be cut and is left behind)
CANCEL_GRACE = 2.0


class PullProgress(Protocol):
    """Receives download progress; the CLI renders it, library callers may ignore it."""

    def blob_started(self, digest: Digest, size: int | None, label: str, offset: int) -> None: ...

    def blob_advanced(self, digest: Digest, n: int) -> None: ...

    def blob_finished(self, digest: Digest, reused: bool) -> None: ...


class PullObserver(Protocol):
    """Follows a pull as it happens, so that layers can be unpacked while they download.

    ``config_ready`` is called once the config is verified, before any layer is fetched;
    ``sink`` wraps the ingest of each layer being downloaded; ``finished`` says that a blob is
    in the store (``ok``) or that the bytes written so far were discarded (not ``ok``).
    """

    def config_ready(self, manifest_digest: Digest, config: ImageConfig,
                     layers: tuple[Descriptor, ...]) -> None: ...

    def sink(self, digest: Digest, ingest: Ingest) -> BlobSink: ...

    def finished(self, digest: Digest, ok: bool) -> None: ...


@dataclass(frozen=True)
class PullOptions:
    platform: Platform | None = None  # None: the host's
    jobs: int = DEFAULT_JOBS
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    max_size: int | None = None  # cache budget (bytes) enforced after the pull
    # always: resolve at the source; missing: a complete cached copy of the reference for the
    # platform is used without asking the source; never: only the cache, else an error
    policy: str = "always"
    # bundles made from the pull: what they may unpack (None: ocistage.cache.unpackbudget default)
    unpack_limit: int | None = None
    # which image policy applies (docs/trust.md); the default looks for the files as
    # containers/image does
    trust: TrustConfig = field(default_factory=TrustConfig)


@dataclass(frozen=True)
class PulledImage:
    name: str                       # the ref name in the cache's index.json
    source: str                     # what the user asked for
    manifest: Descriptor
    index_digest: Digest | None
    platform: Platform
    config: ImageConfig
    config_digest: Digest
    layers: tuple[Descriptor, ...]
    fetched_bytes: int
    reused_blobs: int
    warnings: tuple[Notice, ...] = ()
    cache: Path | None = None       # the cache it was pulled into
    trust: Verdict | None = None    # the image policy's verdict (None: no policy file)

    @property
    def size(self) -> int:
        return self.manifest.size + sum(layer.size for layer in self.layers)

    def to_json(self) -> dict[str, Any]:
        """What ``pull --json`` prints (also ``image`` of ``bundle --json``)."""
        return {
            "name": self.name,
            "digest": str(self.manifest.digest),
            "media_type": self.manifest.media_type,
            "index_digest": str(self.index_digest) if self.index_digest else None,
            "platform": str(self.platform),
            "config": str(self.config_digest),
            "layers": [{"digest": str(layer.digest), "media_type": layer.media_type,
                        "size": layer.size} for layer in self.layers],
            "size": self.size,
            "fetched_bytes": self.fetched_bytes,
            "reused_blobs": self.reused_blobs,
            "cache": str(self.cache) if self.cache is not None else None,
            "warnings": [str(notice) for notice in self.warnings],
            "trust": self.trust.to_json() if self.trust is not None else {
                "accepted": True, "policy": None, "scope": None, "requirement": None,
                "fingerprint": None, "reason": None},
        }

    def render(self, out: Renderer) -> None:
        out.note(f"pulled {self.name} ({self.platform}, {count(len(self.layers), 'layer')}, "
                 f"{format_size(self.size)}; fetched {format_size(self.fetched_bytes)}, "
                 f"reused {count(self.reused_blobs, 'blob')})")
        out.line(str(self.manifest.digest))


@dataclass(frozen=True)
class ResolvedImage:
    """A reference resolved to one platform's manifest, before any layer is fetched."""

    manifest_fetched: FetchedManifest
    manifest: ImageManifest
    index_fetched: FetchedManifest | None
    index: ImageIndex | None
    platform: Platform


class Canceller:
    """Stops a running pull from another thread (Ctrl-C): every provider it uses is aborted,
    so downloads in flight end within a moment and keep what they wrote for a resume."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._providers: list[ImageProvider] = []
        self._cancelled = False

    def register(self, provider: ImageProvider) -> None:
        with self._lock:
            self._providers.append(provider)
            cancelled = self._cancelled
        if cancelled:
            provider.abort()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            providers = list(self._providers)
        for provider in providers:
            provider.abort()


def interrupted(store: Store) -> Interrupted:
    """The error for a pull stopped by Ctrl-C; partial downloads stay for the next pull."""
    return Interrupted(f"interrupted; the partial downloads are kept in {store.ingest_dir}",
                       "run the command again to resume them")


def ref_name(source: ImageSource) -> str:
    """The name under which an image is recorded in the cache's index.json."""
    return str(source)


class CachedImage(OciLayoutProvider):
    """The cache's own copy of an image (the store is an OCI image layout), as a source."""

    def __init__(self, store: Store, name: str, digest: Digest) -> None:
        super().__init__(store.root, name)
        self.name = f"{name} (cached)"
        self._digest = digest

    def resolve(self) -> FetchedManifest:
        return self.manifest(self._digest)


def cached_image(source: ImageSource, store: Store, wanted: Platform) -> CachedImage | None:
    """The cache's copy of ``source`` for ``wanted`` if the cache holds all of it, else None.

    What ``pull`` recorded under :func:`ref_name` is used: the best platform match among its
    entries whose manifest, config and layers are all in the store.
    """
    name = ref_name(source)
    complete: list[tuple[Platform, Digest]] = []
    for entry in store.lookup(name):
        try:
            recorded = parse_descriptor(entry, f"the cache's index.json entry for {name}")
            manifest = parse_manifest(store.read_blob(recorded.digest), recorded.media_type,
                                      validated=True)  # recorded by a pull: it passed then
        except OcistageError:
            continue
        if recorded.platform is None or not isinstance(manifest, ImageManifest):
            continue
        if all(store.has_blob(d.digest) for d in (manifest.config, *manifest.layers)):
            complete.append((recorded.platform, recorded.digest))
    best = select_platform([platform for platform, _ in complete], wanted)
    return None if best is None else CachedImage(store, name, complete[best][1])


def recorded_digests(store: Store, name: str) -> frozenset[Digest]:
    """The manifests (and indexes) a completed pull recorded for ref ``name``: they passed
    the schema then, as did their configs (a pull records only after both were parsed)."""
    found: set[Digest] = set()
    for entry in store.lookup(name):
        annotations = entry.get("annotations")
        for text in (entry.get("digest"),
                     annotations.get(ANNOTATION_INDEX) if isinstance(annotations, dict) else None):
            if isinstance(text, str):
                with contextlib.suppress(OcistageError):
                    found.add(Digest.parse(text))
    return frozenset(found)


def resolve(provider: ImageProvider, wanted: Platform,
            recorded: frozenset[Digest] = frozenset()) -> ResolvedImage:
    """Resolve the provider's reference to the manifest for ``wanted``; documents whose
    digest is in ``recorded`` (:func:`recorded_digests`) skip the schema pass."""
    top = provider.resolve()
    document = parse_manifest(top.data, top.media_type, validated=top.digest in recorded)
    if isinstance(document, ImageIndex):
        descriptor = select_manifest(document, wanted)
        fetched = provider.manifest(descriptor.digest)
        manifest = parse_manifest(fetched.data, fetched.media_type,
                                  validated=fetched.digest in recorded)
        if not isinstance(manifest, ImageManifest):
            raise UnsupportedManifest(
                f"{provider.name}: the index entry for {wanted} is not an image manifest",
                "nested indexes are not supported")
        platform = descriptor.platform or wanted
        return ResolvedImage(fetched, manifest, top, document, platform)
    return ResolvedImage(top, document, None, None, wanted)


def _check_platform(config: ImageConfig, wanted: Platform, explicit: bool,
                    name: str) -> tuple[Platform, list[Notice]]:
    actual = Platform(os=config.os or "linux", architecture=config.architecture or "unknown",
                      variant=config.variant or None)
    warnings: list[Notice] = []
    if (actual.os, actual.normalized().architecture) != (
            wanted.os, wanted.normalized().architecture):
        message = f"{name} is for {actual}, not {wanted}"
        if explicit:
            raise UnsupportedManifest(message, "this image has no manifest for that platform")
        warnings.append(Notice(Kind.PLATFORM, message))
    return actual, warnings


class BlobCounter:
    """Bytes fetched and blobs reused during one pull, shared by its download threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fetched = 0
        self.reused = 0

    def add(self, n: int) -> None:
        with self.lock:
            self.fetched += n

    def reuse(self) -> None:
        with self.lock:
            self.reused += 1


class NoProgress:
    """A :class:`PullProgress` that shows nothing (library callers, piped output)."""

    def blob_started(self, digest: Digest, size: int | None, label: str, offset: int) -> None:
        pass

    def blob_advanced(self, digest: Digest, n: int) -> None:
        pass

    def blob_finished(self, digest: Digest, reused: bool) -> None:
        pass


class NoObserver:
    """A :class:`PullObserver` that follows nothing: blobs go straight into their ingest."""

    def config_ready(self, manifest_digest: Digest, config: ImageConfig,
                     layers: tuple[Descriptor, ...]) -> None:
        pass

    def sink(self, digest: Digest, ingest: Ingest) -> BlobSink:
        return ingest

    def finished(self, digest: Digest, ok: bool) -> None:
        pass


NO_PROGRESS = NoProgress()
NO_OBSERVER = NoObserver()


@dataclass(frozen=True)
class PullRun:
    """One pull: what to fetch (``source``) into which ``store``, how (``options``), and who
    hears about it (``progress``, ``observer``: see :class:`PullProgress`,
    :class:`PullObserver`). ``canceller`` lets another thread stop it; ``in_use`` is the
    caller's lease, extended with what the pull uses (None: a lease of the pull's own, ended
    when it returns)."""

    source: ImageSource
    store: Store
    options: PullOptions = field(default_factory=PullOptions)
    progress: PullProgress = NO_PROGRESS
    observer: PullObserver = NO_OBSERVER
    canceller: Canceller = field(default_factory=Canceller)
    in_use: InUse | None = None


@dataclass(frozen=True)
class Fetcher:
    """Fetches blobs of one provider into the store, reporting to ``progress`` and counting
    into ``counter``."""

    provider: ImageProvider
    store: Store
    progress: PullProgress = NO_PROGRESS
    counter: BlobCounter = field(default_factory=BlobCounter)

    def fetch(self, descriptor: Descriptor, label: str,
              observer: PullObserver = NO_OBSERVER) -> None:
        """Fetch one blob into the store unless it is there; retry once from scratch if
        corrupt. ``observer`` follows the download (see :class:`PullObserver`)."""
        digest = descriptor.digest
        for attempt in (1, 2):
            with self.store.ingest(digest, descriptor.size) as ingest:
                if ingest is None:
                    self.counter.reuse()
                    self.progress.blob_finished(digest, reused=True)
                    observer.finished(digest, ok=True)
                    return
                if self._download(descriptor, label, ingest, observer, last=attempt == 2):
                    return

    def _download(self, descriptor: Descriptor, label: str, ingest: Ingest,
                  observer: PullObserver, last: bool) -> bool:
        """Download into ``ingest`` and commit; False: the bytes were corrupt and discarded
        (raised instead when this was the ``last`` attempt)."""
        digest = descriptor.digest
        self.progress.blob_started(digest, descriptor.size, label, ingest.offset)

        def advanced(n: int) -> None:
            self.counter.add(n)
            self.progress.blob_advanced(digest, n)

        try:
            self.provider.fetch_blob(digest, descriptor.size, observer.sink(digest, ingest),
                                     progress=advanced, urls=descriptor.urls)
            ingest.commit()
        except IntegrityError:
            observer.finished(digest, ok=False)
            if last:
                raise
            return False  # commit() discarded the bad bytes; download once more
        except BaseException:
            observer.finished(digest, ok=False)
            raise
        self.progress.blob_finished(digest, reused=False)
        observer.finished(digest, ok=True)
        return True


def _descriptor_json(descriptor: Descriptor, annotations: dict[str, str],
                     platform: Platform) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "mediaType": descriptor.media_type,
        "digest": str(descriptor.digest),
        "size": descriptor.size,
        "annotations": annotations,
        "platform": {"os": platform.os, "architecture": platform.architecture},
    }
    if platform.variant:
        entry["platform"]["variant"] = platform.variant
    return entry


def pull(source: ImageSource, store: Store, options: PullOptions | None = None,
         progress: PullProgress | None = None,
         provider_factory: Callable[[ImageSource, RegistryConfig], ImageProvider] = open_provider,
         in_use: InUse | None = None, observer: PullObserver | None = None,
         canceller: Canceller | None = None) -> PulledImage:
    """Fetch ``source`` into ``store`` and record it under :func:`ref_name`; see module doc.

    ``in_use``: the caller's lease, extended with what this pull uses (default: a lease of
    this pull's own, ended when it returns). ``observer``: see :class:`PullObserver`.
    ``canceller``: lets another thread stop the pull. A KeyboardInterrupt in the calling
    thread stops the downloads at once and becomes :class:`Interrupted`. The same as
    :func:`run_pull` of a :class:`PullRun` of these.
    """
    run = PullRun(source, store, options or PullOptions(), progress or NO_PROGRESS,
                  observer or NO_OBSERVER, canceller or Canceller(), in_use)
    return run_pull(run, provider_factory)


def run_pull(run: PullRun, provider_factory: Callable[[ImageSource, RegistryConfig],
                                                      ImageProvider] = open_provider
             ) -> PulledImage:
    """:func:`pull` of one :class:`PullRun`."""
    store, options = run.store, run.options
    wanted = (options.platform or host_platform()).normalized()
    cached = cached_image(run.source, store, wanted) if options.policy != "always" else None
    if cached is None and options.policy == "never":
        raise SourceError(f"{run.source} ({wanted}) is not in the cache",
                          "pull it first (ocistage pull), or use --pull missing")
    provider: ImageProvider = (cached if cached is not None
                               else provider_factory(run.source, options.registry))
    lease = run.in_use if run.in_use is not None else InUse(store.root)
    run.canceller.register(provider)
    try:
        try:
            try:
                image = _pull(run, Fetcher(provider, store, run.progress), wanted, lease)
            except _CachedCopyGone:
                provider.close()
                provider = _source_after_gc(run, provider_factory)
                run.canceller.register(provider)
                image = _pull(run, Fetcher(provider, store, run.progress), wanted, lease)
        except KeyboardInterrupt:
            raise interrupted(store) from None
        usage.touch(store.root, "image", image.manifest.digest.hex)
        if options.max_size is not None:
            # only with a budget: ocistage.cache.gc and ocistage.cache.inventory are not needed
            # otherwise
            from ocistage.cache.gc import enforce_budget

            warnings = enforce_budget(store, options.max_size, lease.targets)
            image = dataclasses.replace(image, warnings=image.warnings + warnings)
        return image
    finally:
        provider.close()
        if run.in_use is None:
            lease.release()


class _CachedCopyGone(Exception):
    """The cache's copy of the image, found complete, lost a blob to a ``cache gc`` that had
    read the leases before this pull's lease was recorded (the lease protects only from then
    on, so the pull looks again once it is recorded and that GC is done)."""


def _source_after_gc(run: PullRun, provider_factory: Callable[[ImageSource, RegistryConfig],
                                                              ImageProvider]) -> ImageProvider:
    """Where the image comes from once a GC took the cached copy: its source, as if it had
    never been cached, unless the pull policy is ``never``."""
    if run.options.policy == "never":
        raise SourceError(f"{run.source} is no longer in the cache: a `cache gc` removed it "
                          "while this command started",
                          "pull it again (ocistage pull), or use --pull missing")
    return provider_factory(run.source, run.options.registry)


def _pull(run: PullRun, fetcher: Fetcher, wanted: Platform, in_use: InUse) -> PulledImage:
    source, store, provider = run.source, run.store, fetcher.provider
    recorded = recorded_digests(store, ref_name(source))
    resolved = resolve(provider, wanted, recorded)
    trust = _check_trust(run, resolved, isinstance(provider, CachedImage))
    manifest = resolved.manifest
    config_descriptor = manifest.config
    used = [resolved.manifest_fetched.digest, config_descriptor.digest,
            *(layer.digest for layer in manifest.layers)]
    if resolved.index_fetched is not None:
        used.append(resolved.index_fetched.digest)
    in_use.protect([f"image:{ref_name(source)}", *(f"blob:{d}" for d in used)])
    if isinstance(provider, CachedImage) and not all(store.has_blob(d) for d in used):
        raise _CachedCopyGone  # another member's gc took it before the lease counted
    fetcher.fetch(config_descriptor, "config")
    config = parse_image_config(store.read_blob(config_descriptor.digest),
                                validated=resolved.manifest_fetched.digest in recorded)
    if len(config.diff_ids) != len(manifest.layers):
        raise SchemaError(
            f"{provider.name}: the manifest has {len(manifest.layers)} layers but the "
            f"config lists {len(config.diff_ids)} diff_ids",
            "the image is malformed; rebuild or re-push it")
    platform, warnings = _check_platform(config, wanted, run.options.platform is not None,
                                         provider.name)
    warnings = [*trust.notices, *warnings]
    run.observer.config_ready(resolved.manifest_fetched.digest, config, manifest.layers)
    _fetch_layers(run, fetcher, manifest.layers)
    store.put_blob(resolved.manifest_fetched.data, resolved.manifest_fetched.digest)
    if resolved.index_fetched is not None:
        store.put_blob(resolved.index_fetched.data, resolved.index_fetched.digest)
    descriptor = Descriptor(media_type=manifest.media_type,
                            digest=resolved.manifest_fetched.digest,
                            size=len(resolved.manifest_fetched.data))
    annotations = {
        ANNOTATION_RESOLVED: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        ANNOTATION_SOURCE: str(source),
    }
    if resolved.index_fetched is not None:
        annotations[ANNOTATION_INDEX] = str(resolved.index_fetched.digest)
    name = ref_name(source)
    if not isinstance(provider, CachedImage):  # a cached copy keeps its record as it is
        store.tag(name, _descriptor_json(descriptor, annotations, platform))
    return PulledImage(
        name=name,
        source=str(source),
        manifest=descriptor,
        index_digest=resolved.index_fetched.digest if resolved.index_fetched else None,
        platform=platform,
        config=config,
        config_digest=config_descriptor.digest,
        layers=manifest.layers,
        fetched_bytes=fetcher.counter.fetched,
        reused_blobs=fetcher.counter.reused,
        warnings=tuple(warnings),
        cache=store.root,
        trust=trust.verdict,
    )


def _check_trust(run: PullRun, resolved: ResolvedImage, warm: bool) -> TrustResult:
    """The image policy's verdict on the resolved manifest (the platform's, as skopeo
    checks the instance it copies); ImageRejected before anything else is fetched."""
    from ocistage.bundler.trust.check import check_image

    return check_image(run.options.trust, run.source, resolved.manifest_fetched.digest,
                       run.store, warm=warm)


def _fetch_layers(run: PullRun, fetcher: Fetcher, layers: tuple[Descriptor, ...]) -> None:
    """Fetch ``layers`` in parallel (``options.jobs``), each followed by the observer; when the
    store holds them all (a warm pull) each is taken as it is, without a pool of threads."""
    labels = [f"layer {n}/{len(layers)}" for n in range(1, len(layers) + 1)]
    if all(run.store.has_blob(layer.digest) for layer in layers):
        for layer, label in zip(layers, labels, strict=True):
            fetcher.fetch(layer, label, run.observer)  # found in the store: nothing to download
        return
    from concurrent.futures import ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(max_workers=max(1, run.options.jobs), thread_name_prefix="pull")
    futures = [pool.submit(fetcher.fetch, layer, label, run.observer)
               for layer, label in zip(layers, labels, strict=True)]
    stopped = False
    try:
        for future in futures:
            future.result()
    except KeyboardInterrupt:
        # the downloads stop now and keep what they wrote; a worker still connecting (which
        # no socket shutdown reaches) is not waited for beyond CANCEL_GRACE
        # (ocistage.bundler.cli.app.main then ends the process without it)
        stopped = True
        run.canceller.cancel()
        wait(futures, timeout=CANCEL_GRACE)
        raise
    finally:
        # after an error the other downloads finish into the cache; after Ctrl-C they do not
        pool.shutdown(wait=not stopped, cancel_futures=stopped)
