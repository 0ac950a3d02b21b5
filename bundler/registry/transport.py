"""Moving bytes to and from registries: one ``requests.Session`` per origin, TLS settings.

This module decides nothing about auth, redirects or retries (that is ``registry.py`` and
``auth.py``); it sends one request and streams one body. It is also the one place where
``requests``/``urllib3`` exceptions are translated into ocistage errors::

    RegistryUnreachable
    ├── ConnectionFailed     no HTTP answer at all (refused, reset, DNS, TLS, connect timeout,
    │                        no complete headers before the deadline)
    └── BodyInterrupted      the answer started but its body was cut short (resumable), or
                             arrived slower than the minimum speed

Every exchange is watched (:mod:`ocistage.bundler.registry.watchdog`): the response headers and a
document body
must arrive within ``deadline`` seconds, and any body at ``min_speed`` bytes a second over a
``speed_window``. :meth:`Transport.abort` stops everything in flight at once; the caller then
sees :class:`ocistage.errors.Interrupted`, which no retry loop retries.
"""

from __future__ import annotations

import contextvars
import errno
import ipaddress
import socket
import ssl
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests
import requests.adapters
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.response

from ocistage.bundler.registry.errors import RegistryUnreachable
from ocistage.bundler.registry.watchdog import Limits, Transfer, Watchdog
from ocistage.errors import Interrupted

CHUNK_SIZE = 1 << 20
MIN_YIELD = 1 << 16


class ConnectionFailed(RegistryUnreachable):
    """No HTTP response was received; ``tls`` tells a TLS failure from a plain one, and
    ``retryable`` is false for one that another try cannot change (a certificate that does
    not verify, a host DNS does not know)."""

    def __init__(self, message: str, hint: str | None = None, *, tls: bool = False,
                 retryable: bool = True) -> None:
        super().__init__(message, hint)
        self.tls = tls
        self.retryable = retryable


class BodyInterrupted(RegistryUnreachable):
    """A response body ended early (dropped connection, protocol error, read timeout)."""


@dataclass(frozen=True)
class HttpRequest:
    """One HTTP request as the policy layers build it; ``scope`` is the registry token scope."""

    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    data: Mapping[str, str] | None = None
    scope: str | None = None

    def with_headers(self, changes: Mapping[str, str | None]) -> HttpRequest:
        """A copy with headers set; a ``None`` value removes the header (case-insensitive)."""
        drop = {name.lower() for name in changes}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in drop}
        headers.update({k: v for k, v in changes.items() if v is not None})
        return HttpRequest(self.method, self.url, headers, self.data, self.scope)

    def with_url(self, url: str) -> HttpRequest:
        return HttpRequest(self.method, url, dict(self.headers), self.data, self.scope)


def origin_of(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) with the default port filled in, for same-origin checks."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port


def netloc_of(url: str) -> str:
    return urlsplit(url).netloc


def host_of(registry: str) -> str:
    """The host part of ``host[:port]`` (``[::1]:5000`` -> ``::1``)."""
    return urlsplit(f"//{registry}").hostname or registry


def is_loopback(registry: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1, with or without a port."""
    host = host_of(registry)
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class TlsPolicy:
    """Which hosts skip certificate verification, and the CA bundle for the others."""

    insecure_registries: frozenset[str] = frozenset()
    ca_file: str | None = None
    loopback_insecure: bool = True

    def is_insecure(self, netloc: str) -> bool:
        if netloc in self.insecure_registries or host_of(netloc) in self.insecure_registries:
            return True
        return self.loopback_insecure and is_loopback(netloc)

    def verify_for(self, url: str) -> bool | str:
        if self.is_insecure(netloc_of(url)):
            return False
        return self.ca_file if self.ca_file is not None else True


# The transfer the current thread is sending: the connection classes below hand it their
# socket when they start waiting for a response (a context variable is per thread).
_SENDING: contextvars.ContextVar[Transfer | None] = contextvars.ContextVar("ocistage_sending",
                                                                          default=None)


class _HandsOverItsSocket:
    """Connection mixin: hands the socket to the transfer being sent before waiting on it."""

    sock: socket.socket | None

    def getresponse(self) -> urllib3.response.HTTPResponse:
        transfer = _SENDING.get()
        if transfer is not None and self.sock is not None:
            transfer.attach(self.sock)
        response: urllib3.response.HTTPResponse = super().getresponse()  # type: ignore[misc]
        return response


class _WatchedHTTPConnection(_HandsOverItsSocket, urllib3.connection.HTTPConnection):  # type: ignore[misc]
    pass


class _WatchedHTTPSConnection(_HandsOverItsSocket,  # type: ignore[misc]
                              urllib3.connection.HTTPSConnection):
    pass


class _WatchedHTTPPool(urllib3.connectionpool.HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class _WatchedAdapter(requests.adapters.HTTPAdapter):
    """Connections whose sockets the watchdog can shut down while a thread waits on them."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _WatchedHTTPPool,
                                                   "https": _WatchedHTTPSPool}

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        """The same watched connections through an HTTP(S) proxy (``HTTPS_PROXY`` and the
        like): else a stalled read through a proxy would escape the watchdog."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if isinstance(manager, urllib3.ProxyManager):  # not SOCKS: it has its own classes
            manager.pool_classes_by_scheme = {"http": _WatchedHTTPPool,
                                              "https": _WatchedHTTPSPool}
        return manager


class _UnverifiedTLSAdapter(_WatchedAdapter):
    """HTTPS for an insecure registry: nothing is verified, so no CA store is loaded.

    Without a context of its own, urllib3 loads the system CA store for every new pool even
    when verification is off (~30 ms a process, measured), which a loopback or
    ``--insecure-registry`` host pays on every scheme probe.
    """

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        kwargs["ssl_context"] = context
        super().init_poolmanager(*args, **kwargs)


class Transport:
    """Sends requests, one pooled session per origin; owns no policy beyond TLS settings."""

    def __init__(self, tls: TlsPolicy, *, timeout: float, user_agent: str,
                 deadline: float | None = None, min_speed: float | None = None,
                 speed_window: float = 30.0) -> None:
        self._tls = tls
        self._timeout = timeout
        self._user_agent = user_agent
        self._sessions: dict[tuple[str, str, int], requests.Session] = {}
        self._lock = threading.Lock()
        self._watchdog = Watchdog()
        self._documents = Limits(deadline, min_speed, speed_window)  # headers, manifests, ...
        self._blobs = Limits(None, min_speed, speed_window)  # any size: the speed rule only
        self._sockets: weakref.WeakKeyDictionary[requests.Response, socket.socket] = (
            weakref.WeakKeyDictionary())

    @property
    def cancelled(self) -> bool:
        return self._watchdog.cancelled

    def abort(self) -> None:
        """Stop every request in flight now and refuse new ones (Ctrl-C)."""
        self._watchdog.cancel()

    def pause(self, seconds: float) -> None:
        """Sleep between retries; raises :class:`Interrupted` at once if aborted."""
        if not self._watchdog.pause(seconds):
            raise Interrupted("interrupted")

    def _check_cancelled(self) -> None:
        if self._watchdog.cancelled:
            raise Interrupted("interrupted")

    def _session(self, url: str) -> requests.Session:
        key = origin_of(url)
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                session = requests.Session()
                session.trust_env = False  # no ~/.netrc credentials sent to registries
                netloc = urlsplit(url).netloc
                if not is_loopback(netloc):
                    session.proxies.update(requests.utils.get_environ_proxies(url))
                session.headers["User-Agent"] = self._user_agent
                session.mount("http://", _WatchedAdapter())
                session.mount("https://", _UnverifiedTLSAdapter()
                              if key[0] == "https" and self._tls.is_insecure(netloc)
                              else _WatchedAdapter())
                self._sessions[key] = session
            return session

    def send(self, request: HttpRequest, *, stream: bool = True,
             verify: bool | str | None = None) -> requests.Response:
        """Send once, redirects not followed; the body is left unread when ``stream``.

        The response headers must arrive within the document deadline.
        """
        self._check_cancelled()
        if verify is None:
            verify = self._tls.verify_for(request.url)
        if verify is False:
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        session = self._session(request.url)
        with self._watchdog.watching(self._documents) as transfer:
            token = _SENDING.set(transfer)
            try:
                response = session.request(
                    request.method, request.url, headers=dict(request.headers),
                    data=request.data, stream=stream, allow_redirects=False, verify=verify,
                    timeout=(min(self._timeout, 30.0), self._timeout))
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
                self._check_cancelled()
                if transfer.reason is not None:
                    raise ConnectionFailed(f"{netloc_of(request.url)} sent no complete answer: "
                                           f"the request {transfer.reason}") from exc
                raise translate(exc, request.url, started=False,
                                ca_file=self._tls.ca_file) from exc
            finally:
                _SENDING.reset(token)
        if transfer.sock is not None:
            self._sockets[response] = transfer.sock
        return response

    def _interrupted(self, transfer: Transfer, response: requests.Response) -> None:
        """Raise what stopped a watched body, if the watchdog did."""
        if transfer.cancelled or self._watchdog.cancelled:
            raise Interrupted("interrupted")
        if transfer.reason is not None:
            raise BodyInterrupted(f"download from {netloc_of(response.url)} "
                                  f"{transfer.reason}")

    def iter_body(self, response: requests.Response,
                  chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
        """The raw body (no Content-Encoding decoding) in chunks of up to ``chunk_size``.

        Whatever has arrived is handed on once it reaches :data:`MIN_YIELD` bytes, so a slow or
        stalled connection still shows progress and keeps what it delivered on disk.

        Bytes received before a failure are yielded before :class:`BodyInterrupted` is
        raised, so a resume starts exactly where the data stopped; a body shorter than its
        Content-Length is an interruption too.
        """
        expected = response.headers.get("Content-Length")
        received = 0
        buffer = bytearray()
        failure: BaseException | None = None
        with self._watchdog.watching(self._blobs, self._sockets.get(response)) as transfer:
            try:
                while piece := response.raw.read1(chunk_size - len(buffer),
                                                  decode_content=False):
                    transfer.advance(len(piece))
                    buffer += piece
                    if len(buffer) >= min(chunk_size, MIN_YIELD):
                        received += len(buffer)
                        with transfer.paused_while():
                            yield bytes(buffer)
                        buffer.clear()
                        self._interrupted(transfer, response)
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
                failure = exc
        if buffer:
            received += len(buffer)
            yield bytes(buffer)
        self._interrupted(transfer, response)
        if failure is not None:
            raise translate(failure, response.url, started=True) from failure
        if expected is not None and expected.isdigit() and received < int(expected):
            raise BodyInterrupted(f"connection to {netloc_of(response.url)} closed after "
                                  f"{received} of {expected} bytes")

    def read_body(self, response: requests.Response, limit: int) -> bytes | None:
        """The decoded body, or None if it is longer than ``limit`` bytes."""
        parts: list[bytes] = []
        size = 0
        with self._watchdog.watching(self._documents, self._sockets.get(response)) as transfer:
            try:
                for chunk in response.iter_content(65536):
                    transfer.advance(len(chunk))
                    size += len(chunk)
                    if size > limit:
                        return None
                    parts.append(chunk)
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
                self._interrupted(transfer, response)
                raise translate(exc, response.url, started=True) from exc
            finally:
                response.close()
        self._interrupted(transfer, response)
        return b"".join(parts)

    def discard(self, response: requests.Response, limit: int = 65536) -> None:
        """Drain a small unread body so its connection can be reused, then close."""
        try:
            length = response.headers.get("Content-Length", "")
            if length.isdigit() and int(length) <= limit:
                with self._watchdog.watching(self._documents, self._sockets.get(response)):
                    response.raw.read(int(length), decode_content=False)
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
            pass  # the connection is simply not reused
        finally:
            response.close()

    def close(self) -> None:
        self._watchdog.close()
        with self._lock:
            for session in self._sessions.values():
                session.close()
            self._sessions.clear()


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it wraps (cause, context, args, urllib3 ``reason``)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None),
                  *current.args]
        todo.extend(item for item in linked if isinstance(item, BaseException))


_REASONS: list[tuple[str, bool, Callable[[BaseException], bool]]] = [
    # most specific first: urllib3's NewConnectionError is also a ConnectTimeoutError
    ("connection refused", False, lambda e: isinstance(e, ConnectionRefusedError) or (
        isinstance(e, OSError) and e.errno == errno.ECONNREFUSED)),
    ("host name not resolved", False, lambda e: isinstance(e, socket.gaierror)),
    ("connection reset", False, lambda e: isinstance(e, ConnectionResetError)),
    ("TLS handshake failed (is it a plain-HTTP registry?)", True,
     lambda e: isinstance(e, ssl.SSLError | urllib3.exceptions.SSLError
                          | requests.exceptions.SSLError)),
    ("connection dropped", False,
     lambda e: isinstance(e, urllib3.exceptions.IncompleteRead | urllib3.exceptions.ProtocolError
                          | requests.exceptions.ChunkedEncodingError)),
    ("timed out", False, lambda e: isinstance(e, TimeoutError | socket.timeout | requests.Timeout
                                              | urllib3.exceptions.TimeoutError)),
]


def _verification_failure(causes: list[BaseException]) -> ssl.SSLCertVerificationError | None:
    return next((cause for cause in causes
                 if isinstance(cause, ssl.SSLCertVerificationError)), None)


def _reason(exc: BaseException) -> tuple[str, bool]:
    """A short human reason for a low-level failure, and whether TLS was the problem."""
    causes = list(_causes(exc))
    unverified = _verification_failure(causes)
    if unverified is not None:
        return f"TLS certificate verification failed ({unverified.verify_message})", True
    for reason, tls, matches in _REASONS:
        if any(matches(cause) for cause in causes):
            return reason, tls
    return type(exc).__name__, False


#: getaddrinfo's answers that a name does not exist (not that the resolver failed: EAI_AGAIN)
_NO_SUCH_NAME = frozenset(code for code in (getattr(socket, "EAI_NONAME", None),
                                            getattr(socket, "EAI_NODATA", None))
                          if code is not None)


def _unknown_host(exc: BaseException) -> bool:
    """Whether DNS answered that the host does not exist: no retry mends that."""
    return any(isinstance(cause, socket.gaierror) and cause.errno in _NO_SUCH_NAME
               for cause in _causes(exc))


def unverified_hint(where: str, ca_file: str | None) -> str:
    """What to do about a registry certificate this host does not trust."""
    ca = (f"the CA file {ca_file} does not vouch for it: give --ca-file (or `ca_file`) the "
          "CA that signed it" if ca_file is not None else
          "pass its CA certificate with --ca-file FILE (or `ca_file` in the config file)")
    return (f"{where}'s certificate is not signed by a CA this host trusts: {ca}; or skip "
            f"verification for it with --insecure-registry {where}")


def translate(exc: BaseException, url: str, *, started: bool,
              ca_file: str | None = None) -> RegistryUnreachable:
    """Turn a requests/urllib3/socket failure into ConnectionFailed or BodyInterrupted. A
    certificate that does not verify is a ConnectionFailed no retry changes, whose hint names
    ``--ca-file`` (``ca_file``: the CA file the connection used)."""
    reason, tls = _reason(exc)
    where = netloc_of(url)
    if not started and _unknown_host(exc):
        host = urlsplit(url).hostname or where
        return ConnectionFailed(
            f"cannot connect to {where}: no such host {host} (DNS does not know it)",
            "check the registry's name in the reference (a typo?); a registry only known "
            "inside a network or VPN needs that network, or a --mirror", retryable=False)
    reason, tls = _reason(exc)
    if started:
        return BodyInterrupted(f"download from {where} interrupted: {reason}")
    if _verification_failure(list(_causes(exc))) is not None:
        return ConnectionFailed(f"cannot connect to {where}: {reason}",
                                unverified_hint(where, ca_file), tls=True, retryable=False)
    return ConnectionFailed(f"cannot connect to {where}: {reason}", tls=tls)
