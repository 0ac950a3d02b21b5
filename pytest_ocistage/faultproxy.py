"""A threaded HTTP reverse proxy on 127.0.0.1 that injects faults in front of a registry.

Clients talk plain HTTP to the proxy; the proxy talks HTTP or HTTPS (with the registry's CA) to
the upstream. Bodies are streamed in both directions. The client's ``Host`` header is passed
through, so URLs the registry builds (upload ``Location`` headers) point back at the proxy.

Faults are armed per test with :meth:`FaultProxy.add` and apply to the first ``times`` requests
whose method is in ``methods`` and whose path matches ``path`` (``re.search``)::

    proxy.add(Fault(r"/blobs/sha256:", "drop", after_bytes=1000))    # close mid-body
    proxy.add(Fault(r"/blobs/", "truncate", after_bytes=10))         # short body, honest length
    proxy.add(Fault(r"/blobs/", "flip", after_bytes=5))              # byte 5 XOR 0xff
    proxy.add(Fault(r"/manifests/", "status", status=429, retry_after="1", times=2))
    proxy.add(Fault(r"/blobs/", "stall", after_bytes=200_000))     # hang mid-body
    proxy.add(Fault(r"/manifests/", "trickle", interval=0.5))      # a byte every 0.5 s
    proxy.add(Fault(r"/manifests/", "trickle_headers"))            # ... of the headers

Every request is recorded (:attr:`FaultProxy.requests`) so tests can count how often a path
was fetched, e.g. to prove that no blob is downloaded twice; :attr:`FaultProxy.bytes_sent`
counts the response body bytes relayed (bench/slurm.py reports them per node).
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

CHUNK = 64 * 1024
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailers", "transfer-encoding", "upgrade"})

FaultKind = Literal["drop", "truncate", "flip", "status", "stall", "trickle",
                    "trickle_headers", "redirect"]


@dataclass
class Fault:
    """One fault; ``times`` is how many matching requests it still applies to.

    - ``drop``: send the upstream headers (full Content-Length), then ``after_bytes`` bytes of
      the body, then close the connection.
    - ``truncate``: send only the first ``after_bytes`` bytes with a matching Content-Length
      (a well-formed but short response).
    - ``flip``: invert the byte at offset ``after_bytes`` of the body.
    - ``status``: answer ``status`` (e.g. 429/503) with ``Retry-After: retry_after`` if set,
      without contacting the upstream.
    - ``stall``: send ``after_bytes`` bytes of the body, then hang (connection open, nothing
      sent) until :meth:`FaultProxy.release_stalled`/:meth:`FaultProxy.clear`, proxy shutdown
      or ``stall_seconds``; then close the connection. For killing a client mid-download.
    - ``trickle``: send ``after_bytes`` bytes of the body, then one byte every ``interval``
      seconds (a connection that never times out a read but never finishes either), until
      released as for ``stall``; then close the connection.
    - ``trickle_headers``: the same from the first byte of the status line.
    - ``redirect``: answer ``307 Temporary Redirect`` to ``location`` (as registries send
      blobs to a storage backend), without contacting the upstream.
    """

    path: str
    kind: FaultKind
    after_bytes: int = 0
    status: int = 503
    retry_after: str | None = None
    times: int = 1
    methods: tuple[str, ...] = ("GET",)
    stall_seconds: float = 60.0
    interval: float = 0.5
    location: str = ""

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and method in self.methods and re.search(self.path, path) is not None


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    status: int
    fault: FaultKind | None


@dataclass
class _State:
    upstream: str
    ssl_context: ssl.SSLContext | None
    faults: list[Fault] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)
    requests: list[RecordedRequest] = field(default_factory=list)
    bytes_sent: int = 0  # response body bytes relayed to clients
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.matches(method, path):
                    fault.times -= 1
                    return fault
        return None

    def record(self, entry: RecordedRequest) -> None:
        with self.lock:
            self.requests.append(entry)

    def count_bytes(self, size: int) -> None:
        with self.lock:
            self.bytes_sent += size


def _request_body(handler: BaseHTTPRequestHandler) -> Iterator[bytes]:
    """The client's request body as chunks (Content-Length or chunked encoding)."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return
            remaining = size
            while remaining:
                data = handler.rfile.read(min(CHUNK, remaining))
                if not data:
                    return
                remaining -= len(data)
                yield data
            handler.rfile.readline()
    else:
        remaining = int(handler.headers.get("Content-Length", "0") or "0")
        while remaining > 0:
            data = handler.rfile.read(min(CHUNK, remaining))
            if not data:
                return
            remaining -= len(data)
            yield data


def _response_length(response: http.client.HTTPResponse, fault: Fault | None) -> int | None:
    """The Content-Length to send (None: unknown); a ``truncate`` fault shortens it to the
    fault's ``after_bytes``. ``fault`` is None for a response without a body."""
    header = response.getheader("Content-Length")
    length = int(header) if header is not None else None
    if fault is not None and fault.kind == "truncate":
        length = fault.after_bytes if length is None else min(length, fault.after_bytes)
    return length


def _flipped(data: bytes, offset: int, at: int) -> bytes:
    """``data`` (the body from ``offset`` on) with the byte at body offset ``at`` inverted,
    if it holds that byte."""
    if not offset <= at < offset + len(data):
        return data
    index = at - offset
    return data[:index] + bytes([data[index] ^ 0xFF]) + data[index + 1:]


class _Handler(BaseHTTPRequestHandler):
    server: _ProxyServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._proxy()

    do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _proxy(self) -> None:
        state = self.server.state
        headers = {k: v for k, v in self.headers.items()}
        fault = state.take_fault(self.command, self.path)
        if fault is not None and fault.kind in ("status", "redirect"):
            self._answer_locally(fault, headers)
            return
        upstream = self._connect()
        try:
            response = self._forward(upstream)
        except (OSError, http.client.HTTPException):
            # the upstream is unreachable or broke before answering: a gateway error
            state.record(RecordedRequest(self.command, self.path, headers, 502, None))
            self._answer_bad_gateway()
            upstream.close()
            return
        try:
            # recorded before the client can see the response, so tests never race the count
            state.record(RecordedRequest(self.command, self.path, headers, response.status,
                                         fault.kind if fault is not None else None))
            self._relay(response, fault)
        except (OSError, http.client.HTTPException):
            self.close_connection = True  # client went away or upstream broke mid-body
        finally:
            upstream.close()

    def _answer_locally(self, fault: Fault, headers: dict[str, str]) -> None:
        """A ``status`` or ``redirect`` fault: the request body is read and dropped, and the
        answer comes from here, without the upstream."""
        for _ in _request_body(self):
            pass
        status = fault.status if fault.kind == "status" else 307
        self.server.state.record(RecordedRequest(self.command, self.path, headers, status,
                                                 fault.kind))
        if fault.kind == "status":
            self._answer_status(fault)
        else:
            self.send_response(307)
            self.send_header("Location", fault.location)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def _forward(self, upstream: http.client.HTTPConnection) -> http.client.HTTPResponse:
        """Send the client's request (headers but the hop-by-hop ones, body streamed) to the
        upstream; its response."""
        chunked = self.headers.get("Transfer-Encoding", "").lower() == "chunked"
        upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for key, value in self.headers.items():
            if key.lower() not in HOP_BY_HOP:
                upstream.putheader(key, value)
        if chunked:
            upstream.putheader("Transfer-Encoding", "chunked")
        upstream.endheaders()
        if chunked or "Content-Length" in self.headers:
            for data in _request_body(self):
                upstream.send(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            if chunked:
                upstream.send(b"0\r\n\r\n")
        return upstream.getresponse()

    def _connect(self) -> http.client.HTTPConnection:
        url = urlsplit(self.server.state.upstream)
        host, port = url.hostname or "127.0.0.1", url.port
        if url.scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=60,
                                               context=self.server.state.ssl_context)
        return http.client.HTTPConnection(host, port, timeout=60)

    def _answer_bad_gateway(self) -> None:
        self.close_connection = True
        with suppress(OSError):
            self.send_response(502)
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()

    def _answer_status(self, fault: Fault) -> None:
        body = (b'{"errors":[{"code":"TOOMANYREQUESTS","message":"injected by faultproxy"}]}'
                if fault.status == 429 else b'{"errors":[{"code":"UNAVAILABLE",'
                b'"message":"injected by faultproxy"}]}')
        self.send_response(fault.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if fault.retry_after is not None:
            self.send_header("Retry-After", fault.retry_after)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _relay(self, response: http.client.HTTPResponse, fault: Fault | None) -> None:
        if fault is not None and fault.kind == "trickle_headers":
            self._trickle(f"HTTP/1.1 {response.status} {response.reason}\r\n".encode(), fault)
            self._drop()
            return
        has_body = self.command != "HEAD" and response.status not in (204, 304)
        length = _response_length(response, fault if has_body else None)
        self._send_headers(response, length)
        if has_body:
            self._relay_body(response, fault, length)

    def _send_headers(self, response: http.client.HTTPResponse, length: int | None) -> None:
        """The upstream's status and headers (but the hop-by-hop ones) with Content-Length
        ``length``; without one, the connection closes after the body."""
        self.send_response_only(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                self.send_header(key, value)
        if length is not None:
            self.send_header("Content-Length", str(length))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()

    def _relay_body(self, response: http.client.HTTPResponse, fault: Fault | None,
                    limit: int | None) -> None:
        """The body, up to ``limit`` bytes (None: to its end), with ``fault`` applied."""
        kind = fault.kind if fault is not None else None
        cut = fault if kind in ("drop", "stall", "trickle") else None
        flip_at = fault.after_bytes if fault is not None and kind == "flip" else None
        sent = 0
        while limit is None or sent < limit:
            want = CHUNK if limit is None else min(CHUNK, limit - sent)
            if cut is not None:
                want = min(want, cut.after_bytes - sent)
                if want <= 0:
                    self._cut(response, cut)
                    return
            data = response.read(want)
            if not data:
                break
            if flip_at is not None:
                data = _flipped(data, sent, flip_at)
            # counted before the client can have it, so a count read after a response never
            # misses its last chunk
            self.server.state.count_bytes(len(data))
            self.wfile.write(data)
            sent += len(data)
        if cut is not None:
            self._drop()
        elif kind == "truncate":
            self.close_connection = True  # the upstream body was not read to its end

    def _cut(self, response: http.client.HTTPResponse, fault: Fault) -> None:
        """A ``drop``, ``stall`` or ``trickle`` fault at its offset: stall or trickle the
        rest first, then close the connection."""
        if fault.kind == "stall":
            self._stall(fault)
        if fault.kind == "trickle":
            self._trickle(response.read(), fault)
        self._drop()

    def _trickle(self, data: bytes, fault: Fault) -> None:
        """Send ``data`` a byte at a time, ``fault.interval`` apart, until released."""
        self.wfile.flush()
        with self.server.state.lock:
            released = self.server.state.released
        deadline = time.monotonic() + fault.stall_seconds
        for byte in data:
            if released.wait(timeout=fault.interval) or time.monotonic() > deadline:
                return
            self.wfile.write(bytes([byte]))
            self.wfile.flush()

    def _stall(self, fault: Fault) -> None:
        self.wfile.flush()
        with self.server.state.lock:
            released = self.server.state.released
        released.wait(timeout=fault.stall_seconds)

    def _drop(self) -> None:
        self.wfile.flush()
        self.close_connection = True
        with suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: _State) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state


@dataclass(frozen=True)
class FaultProxy:
    """A running proxy: ``host``/``url`` to use in references instead of the registry's."""

    host: str
    url: str
    _state: _State

    def add(self, fault: Fault) -> Fault:
        with self._state.lock:
            self._state.faults.append(fault)
        return fault

    def clear(self) -> None:
        """Forget all faults, recorded requests and byte counts; release stalled responses."""
        with self._state.lock:
            self._state.faults.clear()
            self._state.requests.clear()
            self._state.bytes_sent = 0
        self.release_stalled()

    def release_stalled(self) -> None:
        """End every response currently stalled by a ``stall`` fault (they then close)."""
        with self._state.lock:
            released, self._state.released = self._state.released, threading.Event()
        released.set()

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._state.lock:
            return list(self._state.requests)

    @property
    def bytes_sent(self) -> int:
        """Response body bytes relayed to clients since the start (or the last clear)."""
        with self._state.lock:
            return self._state.bytes_sent

    def count(self, path: str, methods: tuple[str, ...] = ("GET",)) -> int:
        """How many recorded requests with a method in methods had a path matching path."""
        return sum(1 for r in self.requests
                   if r.method in methods and re.search(path, r.path) is not None)

    def counts(self, methods: tuple[str, ...] = ("GET",)) -> dict[str, int]:
        """Requests per path."""
        result: dict[str, int] = {}
        for r in self.requests:
            if r.method in methods:
                result[r.path] = result.get(r.path, 0) + 1
        return result


@contextmanager
def running_fault_proxy(upstream: str, ca_file: Path | None = None) -> Iterator[FaultProxy]:
    """Start a proxy in front of upstream ("http://127.0.0.1:PORT" or https with ca_file)."""
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file is not None else None
    state = _State(upstream=upstream.rstrip("/"), ssl_context=context)
    server = _ProxyServer(state)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="faultproxy",
                              daemon=True)
    thread.start()
    proxy = None
    try:
        host, port = server.server_address[:2]
        proxy = FaultProxy(host=f"{host!s}:{port}", url=f"http://{host!s}:{port}", _state=state)
        yield proxy
    finally:
        if proxy is not None:
            proxy.release_stalled()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
