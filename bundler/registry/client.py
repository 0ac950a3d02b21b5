"""RegistryClient: the OCI distribution API (ping, manifests, blobs) and its policy.

A request passes through small layered steps (the httpx shape)::

    mirrors -> retries (backoff, Retry-After) -> redirects (own-host auth only)
            -> scheme probing (https, then http for insecure hosts) -> auth flow -> send once

``transport.py`` moves the bytes; ``auth.py`` answers challenges. Blob downloads are a small
state machine (the pip shape): stream into the caller's sink; on a dropped connection resume
with ``Range: bytes=<offset>-``; a ``200`` to a ranged request, or a ``206`` starting elsewhere,
restarts the sink; give up after ``max_retries`` interruptions. The sink verifies the digest.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urljoin, urlsplit

import requests

from ocistage.bundler.image.errors import UnsupportedManifest
from ocistage.bundler.registry.auth import RETRYABLE_STATUS, Authenticator, TokenCache
from ocistage.bundler.registry.cafile import check_ca_file
from ocistage.bundler.registry.errors import (
    AuthenticationError,
    RateLimited,
    RegistryError,
    RegistryUnreachable,
)
from ocistage.bundler.registry.names import (
    base_urls,
    pull_scope,
    validate_reference,
    validate_repository,
)
from ocistage.bundler.registry.responses import (
    content_range,
    error_detail,
    media_type_of,
    parse_retry_after,
)
from ocistage.bundler.registry.transport import (
    BodyInterrupted,
    ConnectionFailed,
    HttpRequest,
    TlsPolicy,
    Transport,
    netloc_of,
    origin_of,
)
from ocistage.bundler.registry.types import BlobSink as BlobSink
from ocistage.bundler.registry.types import FetchedManifest as FetchedManifest
from ocistage.bundler.registry.types import RegistryConfig as RegistryConfig
from ocistage.cache.digest import Digest
from ocistage.errors import IntegrityError, NotFound, UsageError

if TYPE_CHECKING:
    from ocistage.bundler.registry.credentials import Credentials, CredentialStore

log = logging.getLogger(__name__)
# one line per retry, for the user (the CLI shows them on stderr unless -q)
notices = logging.getLogger("ocistage.retry")

MANIFEST_LIMIT = 4 << 20
MAX_REDIRECTS = 10
SCHEMA1_MEDIA_TYPES = frozenset({
    "application/vnd.docker.distribution.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v1+prettyjws",
})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})

T = TypeVar("T")




@dataclass
class _Endpoint:
    """One place serving the registry API: the origin or a mirror."""

    name: str                     # host[:port], for messages, credentials and auth
    bases: list[str]              # candidate base URLs, in order ("https://h", "http://h")
    auth: Authenticator
    retries: int
    resolved: str | None = None   # the base that answered first; used from then on

    def candidates(self) -> list[str]:
        return [self.resolved] if self.resolved is not None else self.bases


class _Answer(Enum):
    """What a blob download's answer means (else: a reason to try again)."""

    BODY = "body"          # a body to stream into the sink
    COMPLETE = "complete"  # the sink holds the whole blob


@dataclass
class _BlobDownload:
    """State of one blob download: what is wanted and how many interruptions so far."""

    digest: Digest
    size: int | None
    sink: BlobSink
    what: str
    started: float       # retry_time counts from here: the first try, or the last progress
    attempts: int = 0
    progressed_to: int = 0


class RegistryClient:
    """A client for one registry (``docker.io``, ``localhost:5000``, ``[::1]:5000``, …).

    Safe to share between threads fetching blobs in parallel. ``sleep`` and ``clock`` are
    injectable so tests of backoff and token expiry do not wait; the default sleep ends at
    once, raising :class:`ocistage.errors.Interrupted`, when :meth:`abort` is called.

    Retries are bounded by count (``max_retries``) and by time: no retry starts more than
    ``retry_time`` seconds after the first try of a request, or after the last progress of a
    blob download (a long download that keeps moving is always resumed).
    """

    def __init__(self, registry: str, config: RegistryConfig | None = None, *,
                 sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.registry = registry
        self._config = config or RegistryConfig()
        self._clock = clock
        self._rng = rng or random.Random()
        self._rng_lock = threading.Lock()
        if self._config.ca_file is not None:  # a usage error now, not six failed connects
            check_ca_file(self._config.ca_file, self._config.ca_file_origin)
        tls = TlsPolicy(self._config.insecure_registries, self._config.ca_file,
                        self._config.loopback_insecure)
        self._tls = tls
        self._transport = Transport(tls, timeout=self._config.timeout,
                                    user_agent=self._config.user_agent,
                                    deadline=self._config.deadline,
                                    min_speed=self._config.min_speed,
                                    speed_window=self._config.speed_window)
        self._sleep = sleep if sleep is not None else self._transport.pause
        self._tokens = TokenCache(clock)
        # None: the caller's credential files, looked up at the first challenge (a registry
        # that asks for none, as a warm pull's tag check often is, never needs them)
        self._credentials: CredentialStore | None = self._config.credentials
        self._mirrors = [self._endpoint(url, mirror=True)
                         for url in self._config.mirrors.get(registry, ())]
        self._origin = self._endpoint(registry, mirror=False)

    # -- setup --------------------------------------------------------------------------

    def _endpoint(self, location: str, *, mirror: bool) -> _Endpoint:
        name, bases = base_urls(location, self._tls)
        lookup_name = name if mirror else self.registry

        def lookup(repository: str | None) -> Credentials | None:
            return self._credential_store().lookup(lookup_name, repository)
        auth = Authenticator(name, lookup, self._tokens, self._transport.read_body)
        retries = 0 if mirror else self._config.max_retries
        return _Endpoint(name, bases, auth, retries)

    def _credential_store(self) -> CredentialStore:
        if self._credentials is None:
            from ocistage.bundler.registry.credentials import CredentialStore

            self._credentials = CredentialStore.from_environment()
        return self._credentials

    # -- public API ---------------------------------------------------------------------

    def ping(self) -> None:
        """Check that the registry answers its ``/v2/`` API (authenticating if asked to)."""
        def attempt(endpoint: _Endpoint) -> None:
            with self._closing(self._request(endpoint, "/v2/", {}, None)) as response:
                if response.status_code != 200:
                    self._raise_for_status(endpoint.name, response, "the /v2/ API")
        self._each_endpoint(attempt)

    def get_manifest(self, repository: str, reference: str,
                     accept: Sequence[str]) -> FetchedManifest:
        """A manifest or index by tag or digest, verified, at most 4 MiB."""
        validate_repository(repository)
        wanted = validate_reference(reference)
        what = f"{repository}@{reference}" if wanted else f"{repository}:{reference}"
        headers = {"Accept": ", ".join(accept)} if accept else {}
        path = f"/v2/{repository}/manifests/{reference}"

        def attempt(endpoint: _Endpoint) -> FetchedManifest:
            tries = 0
            started = self._clock()
            while True:
                response = self._request(endpoint, path, headers, pull_scope(repository))
                with self._closing(response):
                    if response.status_code != 200:
                        self._raise_for_status(endpoint.name, response, what)
                    try:
                        return self._read_manifest(endpoint, response, what, wanted)
                    except BodyInterrupted as exc:
                        delay = self._backoff(tries)
                        if not self._may_retry(tries, endpoint.retries, started, delay):
                            raise
                        self._notice(str(exc), delay, tries + 2, endpoint.retries + 1)
                self._sleep(delay)
                tries += 1
        return self._each_endpoint(attempt)

    def fetch_blob(self, repository: str, digest: Digest, size: int | None, sink: BlobSink,
                   progress: Callable[[int], None] | None = None,
                   urls: Sequence[str] = ()) -> None:
        """Stream a blob into ``sink``, resuming from ``sink.offset``; ``urls`` after a 404."""
        validate_repository(repository)
        state = _BlobDownload(digest, size, sink, f"blob {digest} of {repository}",
                              self._clock())
        path = f"/v2/{repository}/blobs/{digest}"

        def attempt(endpoint: _Endpoint) -> None:
            def open_(headers: Mapping[str, str]) -> requests.Response:
                return self._request(endpoint, path, headers, pull_scope(repository))
            self._download(state, open_, endpoint.name, endpoint.retries, progress)

        try:
            self._each_endpoint(attempt)
        except NotFound as missing:
            if not urls:
                raise
            self._fetch_from_urls(state, urls, missing, progress)

    def abort(self) -> None:
        """Stop every request in flight at once (Ctrl-C); they raise ``Interrupted``."""
        self._transport.abort()

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- mirrors ------------------------------------------------------------------------

    def _each_endpoint(self, attempt: Callable[[_Endpoint], T]) -> T:
        """Try each mirror, then the origin; a failing mirror falls through to the next."""
        for mirror in self._mirrors:
            try:
                return attempt(mirror)
            except (RegistryUnreachable, NotFound, RateLimited, AuthenticationError) as exc:
                log.info("mirror %s failed (%s); trying the next source", mirror.name, exc)
        return attempt(self._origin)

    # -- requests: retries -> redirects -> scheme probing -> auth -> send ---------------

    def _request(self, endpoint: _Endpoint, path: str, headers: Mapping[str, str],
                 scope: str | None) -> requests.Response:
        """GET ``path`` on an endpoint, retried on connection errors, 429 and 5xx."""
        return self._retrying(endpoint.name, endpoint.retries,
                              lambda: self._follow(*self._on_endpoint(endpoint, path, headers,
                                                                      scope)))

    def _may_retry(self, attempt: int, retries: int, started: float, delay: float) -> bool:
        """Whether try ``attempt`` (0-based) may be followed by another after ``delay``."""
        return (attempt < retries
                and self._clock() - started + delay <= self._config.retry_time)

    @staticmethod
    def _notice(reason: str, delay: float, attempt: int, attempts: int) -> None:
        notices.info("%s; retrying in %.1f s (attempt %d of %d)", reason, delay, attempt,
                     attempts)

    def _retrying(self, name: str, retries: int,
                  send: Callable[[], requests.Response]) -> requests.Response:
        attempt = 0
        started = self._clock()
        while True:
            try:
                response = send()
            except ConnectionFailed as exc:
                delay = self._backoff(attempt)
                if not exc.retryable or not self._may_retry(attempt, retries, started, delay):
                    raise
                reason = str(exc)
            else:
                status = response.status_code
                if status not in RETRYABLE_STATUS:
                    return response
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                delay = (min(retry_after, self._config.backoff_max) if retry_after is not None
                         else self._backoff(attempt))
                if not self._may_retry(attempt, retries, started, delay):
                    detail = error_detail(self._transport, response)
                    tries = f"{attempt + 1} attempt{'s' if attempt else ''}"
                    if status == 429:
                        raise RateLimited(f"{name} is rate-limiting requests (429: {detail}); "
                                          f"gave up after {tries}")
                    raise RegistryUnreachable(f"{name} keeps failing with {detail} "
                                              f"(gave up after {tries})",
                                              hint="the registry is having trouble; retry later")
                reason = f"{name} answered HTTP {status}"
                response.close()
            self._notice(reason, delay, attempt + 2, retries + 1)
            self._sleep(delay)
            attempt += 1

    def _backoff(self, attempt: int) -> float:
        base = min(self._config.backoff_max, self._config.backoff_base * 2.0 ** attempt)
        with self._rng_lock:
            return base * (0.5 + self._rng.random() / 2)

    def _follow(self, request: HttpRequest, response: requests.Response) -> requests.Response:
        """Follow redirects; ``Authorization`` only ever goes back to the same origin."""
        for _ in range(MAX_REDIRECTS):
            location = response.headers.get("Location")
            if response.status_code not in _REDIRECTS or not location:
                return response
            self._transport.discard(response)
            target = urljoin(request.url, location)
            if urlsplit(target).scheme not in ("http", "https"):
                raise RegistryError(f"{netloc_of(request.url)} redirected to an unsupported "
                                    f"location {target!r}")
            if origin_of(target) != origin_of(request.url):
                request = request.with_headers({"Authorization": None})
            request = request.with_url(target)
            response = self._transport.send(request)
        response.close()
        raise RegistryError(f"too many redirects from {netloc_of(request.url)}")

    def _on_endpoint(self, endpoint: _Endpoint, path: str, headers: Mapping[str, str],
                     scope: str | None) -> tuple[HttpRequest, requests.Response]:
        """Send on the endpoint's base URL; an insecure host falls back from https to http."""
        candidates = endpoint.candidates()
        for index, base in enumerate(candidates):
            request = HttpRequest("GET", base + path, dict(headers), scope=scope)
            try:
                sent = self._authenticated(endpoint.auth, request)
            except ConnectionFailed as exc:
                if index + 1 >= len(candidates):
                    raise
                log.debug("%s: %s; trying %s", endpoint.name, exc, candidates[index + 1])
                continue
            endpoint.resolved = base
            return sent
        raise AssertionError("an endpoint has at least one base URL")

    def _authenticated(self, auth: Authenticator,
                       request: HttpRequest) -> tuple[HttpRequest, requests.Response]:
        """Drive the auth flow: send what it yields, feed back responses; the last pair."""
        flow = auth.flow(request)
        to_send = next(flow)
        while True:
            response = self._transport.send(to_send)
            try:
                next_request = flow.send(response)
            except StopIteration:
                return to_send, response
            except BaseException:
                response.close()
                raise
            self._transport.discard(response)
            to_send = next_request

    # -- responses ----------------------------------------------------------------------

    @staticmethod
    @contextmanager
    def _closing(response: requests.Response) -> Iterator[requests.Response]:
        try:
            yield response
        finally:
            response.close()

    def _raise_for_status(self, name: str, response: requests.Response, what: str) -> None:
        status = response.status_code
        detail = error_detail(self._transport, response)
        if status == 404:
            raise NotFound(f"{what} not found on {name} ({detail})")
        if status in (401, 403):
            raise AuthenticationError(f"{name} denied access to {what} ({detail})")
        raise RegistryError(f"{name} answered {detail} for {what}",
                            hint="this looks like a registry-side problem; retry later")

    def _read_manifest(self, endpoint: _Endpoint, response: requests.Response, what: str,
                       wanted: Digest | None) -> FetchedManifest:
        length = response.headers.get("Content-Length", "")
        data = None
        if not (length.isdigit() and int(length) > MANIFEST_LIMIT):
            data = self._transport.read_body(response, MANIFEST_LIMIT)
        if data is None:
            raise RegistryError(f"manifest {what} on {endpoint.name} is larger than "
                                f"{MANIFEST_LIMIT >> 20} MiB", hint="this is not a manifest")
        media_type = media_type_of(response, data)
        if media_type in SCHEMA1_MEDIA_TYPES:
            raise UnsupportedManifest(
                f"{what} uses the deprecated Docker schema 1 manifest format ({media_type})",
                hint="re-push the image with a current docker/skopeo/buildah "
                     "(schema 2 or OCI)")
        if wanted is not None:
            wanted.verify_bytes(data, f"manifest {what}")
            return FetchedManifest(media_type, wanted, data)
        computed = Digest.of_bytes(data)
        header = response.headers.get("Docker-Content-Digest")
        if header:
            try:
                claimed = Digest.parse(header.strip())
            except UsageError as exc:  # a remote fault here, not the user's
                raise IntegrityError(f"{endpoint.name} sent an invalid Docker-Content-Digest "
                                     f"{header!r} for {what}") from exc
            claimed.verify_bytes(data, f"manifest {what}")
            return FetchedManifest(media_type, claimed, data)
        return FetchedManifest(media_type, computed, data)

    # -- blobs --------------------------------------------------------------------------

    def _fetch_from_urls(self, state: _BlobDownload, urls: Sequence[str], missing: NotFound,
                         progress: Callable[[int], None] | None) -> None:
        """Non-distributable layers: try the descriptor's URLs (no credentials sent)."""
        error: Exception = missing
        for url in urls:
            if urlsplit(url).scheme not in ("http", "https"):
                log.debug("skipping layer URL %s: not http(s)", url)
                continue
            name = netloc_of(url)

            def open_(headers: Mapping[str, str], url: str = url) -> requests.Response:
                def send() -> requests.Response:
                    request = HttpRequest("GET", url, dict(headers))
                    return self._follow(request, self._transport.send(request))
                return self._retrying(netloc_of(url), self._config.max_retries, send)
            try:
                self._download(state, open_, name, self._config.max_retries, progress)
                return
            except (NotFound, RegistryUnreachable, RegistryError) as exc:
                log.info("layer URL %s failed: %s", url, exc)
                error = exc
        raise error

    def _download(self, state: _BlobDownload,
                  open_: Callable[[Mapping[str, str]], requests.Response], name: str,
                  retries: int, progress: Callable[[int], None] | None) -> None:
        """The resume state machine; returns when the sink holds the whole blob."""
        sink = state.sink
        while True:
            if state.size is not None and sink.offset > state.size:
                sink.restart()
            offset = sink.offset
            if state.size is not None and offset == state.size and offset > 0:
                return
            headers = {"Accept-Encoding": "identity"}
            if offset > 0:
                headers["Range"] = f"bytes={offset}-"
            with self._closing(open_(headers)) as response:
                answer = self._answer(state, response, name, offset)
                if answer is _Answer.BODY:
                    answer = self._body(state, response, name, progress)
            if answer is _Answer.COMPLETE:
                return
            assert isinstance(answer, str)
            self._interrupted(state, retries, answer)

    def _answer(self, state: _BlobDownload, response: requests.Response, name: str,
                offset: int) -> _Answer | str:
        """What an answer to a request from ``offset`` means: a body to stream, the blob
        already complete, or why to try again (the sink restarted where its bytes are of no
        use); raises for an error status."""
        status = response.status_code
        if status == 416:
            _, total = content_range(response)
            if offset > 0 and (offset == state.size or total == offset):
                return _Answer.COMPLETE
            state.sink.restart()
            return f"{name} refused the range {offset}-"
        if status == 206:
            start, _ = content_range(response)
            if start != offset:
                log.debug("%s: resume answer starts at %s, not %d; restarting", name, start,
                          offset)
                state.sink.restart()
                return f"{name} answered a resume with the wrong range"
        elif status == 200:
            if offset > 0:
                log.debug("%s ignored Range; downloading %s again", name, state.what)
                state.sink.restart()
        else:
            self._raise_for_status(name, response, state.what)
        return _Answer.BODY

    def _body(self, state: _BlobDownload, response: requests.Response, name: str,
              progress: Callable[[int], None] | None) -> _Answer | str:
        """Stream the body into the sink: COMPLETE, or why to try again."""
        try:
            self._stream(state, response, progress)
        except BodyInterrupted as exc:
            return str(exc)
        if state.size is not None and state.sink.offset < state.size:
            return (f"{name} ended {state.what} after {state.sink.offset} of {state.size} "
                    "bytes")
        return _Answer.COMPLETE

    def _stream(self, state: _BlobDownload, response: requests.Response,
                progress: Callable[[int], None] | None) -> None:
        sink = state.sink
        for chunk in self._transport.iter_body(response):
            if state.size is not None and sink.offset + len(chunk) > state.size:
                raise IntegrityError(f"{state.what} is larger than its declared size "
                                     f"{state.size}")
            sink.write(chunk)
            if progress is not None:
                progress(len(chunk))

    def _interrupted(self, state: _BlobDownload, retries: int, reason: str) -> None:
        """Count an interrupted download; sleep before the next try or give up."""
        state.attempts += 1
        if state.sink.offset > state.progressed_to:  # a long download that moved on
            state.started, state.progressed_to = self._clock(), state.sink.offset
        delay = self._backoff(state.attempts - 1)
        if not self._may_retry(state.attempts - 1, retries, state.started, delay):
            raise RegistryUnreachable(f"{reason}; gave up on {state.what} after "
                                      f"{state.attempts} attempts")
        self._notice(reason, delay, state.attempts + 1, retries + 1)
        self._sleep(delay)
