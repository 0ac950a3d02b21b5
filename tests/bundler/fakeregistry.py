"""An in-process OCI distribution registry on 127.0.0.1 for policy tests.

A real ``http.server`` in a thread, serving manifests and blobs from dicts. Each test
configures the faults it wants on :class:`FakeRegistry` attributes: bearer or basic auth
(with a token endpoint on the same server), 429/500 answers, dropped connections mid-blob,
ignored ``Range``, redirects of blobs to another server, corrupted bytes. Every request is
recorded (method, path, headers) so tests can check what the client sent where.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass
class FakeRegistry:
    """State and fault switches of one fake registry; mutate attributes between requests."""

    manifests: dict[tuple[str, str], tuple[str, bytes]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    auth: str = "none"                          # "none" | "bearer" | "basic"
    users: dict[str, str] = field(default_factory=dict)   # username -> password
    refresh_tokens: dict[str, str] = field(default_factory=dict)  # refresh token -> username
    anonymous_pull: bool = True                 # bearer: tokens without credentials allowed
    token_expires_in: int | None = 300
    fail_429: int = 0                           # answer this many requests with 429 first
    retry_after: str | None = None
    fail_500: int = 0                           # ... or with 500
    token_fail_503: int = 0                     # the token endpoint fails this many times
    token_get_refused: bool = False             # the token endpoint only takes OAuth2 POSTs
    drop_after: int | None = None               # close the socket after this many body bytes
    drop_times: int = 0                         # ... this many times (then serve normally)
    stall_after: int | None = None              # send this many body bytes, then go silent
    stall_times: int = 0
    stall_seconds: float = 2.0
    chunked: bool = False                       # blobs with Transfer-Encoding: chunked
    accept_tokens: bool = True                  # False: every bearer token is refused
    ignore_range: bool = False
    wrong_range_start: bool = False             # 206 with a Content-Range at another offset
    redirect_blobs_to: str | None = None        # base URL of another server
    corrupt: bool = False                       # flip the first byte of blob bodies
    wrong_digest_header: bool = False
    content_type: str | None = None             # override manifest Content-Type
    forbid: bool = False                        # 403 everything under /v2/<repo>
    error_body: bytes | None = None             # the body of every 404 instead of the usual
    token_body: bytes | None = None             # the token endpoint's reply instead of a token
    token_realm: str | None = None              # the bearer realm (default: this server's /token)
    requests: list[Recorded] = field(default_factory=list)
    issued_tokens: dict[str, str] = field(default_factory=dict)  # token -> scope
    lock: threading.Lock = field(default_factory=threading.Lock)
    base_url: str = ""
    netloc: str = ""

    # -- content helpers --------------------------------------------------------------

    def add_blob(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return digest

    def add_manifest(self, repository: str, tag: str, data: bytes,
                     media_type: str = OCI_MANIFEST) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.manifests[(repository, tag)] = (media_type, data)
        self.manifests[(repository, digest)] = (media_type, data)
        return digest

    def paths(self, prefix: str = "") -> list[str]:
        with self.lock:
            return [r.path for r in self.requests if r.path.startswith(prefix)]

    def token_requests(self) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.path.startswith("/token")]


def _errors(code: str, message: str) -> bytes:
    return json.dumps({"errors": [{"code": code, "message": message}]}).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    @property
    def state(self) -> FakeRegistry:
        return self.server.state

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              ) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self._record(body)
        if urlsplit(self.path).path != "/token":
            self._send(405)
            return
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        user: str | None
        if form.get("grant_type") == "password":
            user = form.get("username", "")
            if self.state.users.get(user) != form.get("password"):
                user = None
        elif form.get("grant_type") == "refresh_token":
            user = self.state.refresh_tokens.get(form.get("refresh_token", ""))
        else:
            user = None
        if user is None:
            self._send(401, b'{"error":"invalid_grant"}')
            return
        self._issue_token(form.get("scope", ""), "access_token")

    def do_GET(self) -> None:
        self._record(b"")
        parts = urlsplit(self.path)
        if parts.path == "/token":
            self._token(parts.query)
            return
        with self.state.lock:
            if self.state.fail_429 > 0:
                self.state.fail_429 -= 1
                headers = {"Retry-After": self.state.retry_after} if self.state.retry_after else {}
                self._send(429, _errors("TOOMANYREQUESTS", "slow down"), headers)
                return
            if self.state.fail_500 > 0:
                self.state.fail_500 -= 1
                self._send(500, b"oops")
                return
        if parts.path.startswith("/v2/") and not self._authorized(parts.path):
            return
        if parts.path == "/v2/" or parts.path == "/v2":
            self._send(200, b"{}", {"Content-Type": "application/json"})
            return
        match = re.fullmatch(r"/v2/(.+)/(manifests|blobs)/([^/]+)", parts.path)
        if match is None:
            self._send(404, _errors("NOT_FOUND", "no such API"))
            return
        repository, kind, reference = match.groups()
        if kind == "manifests":
            self._manifest(repository, reference)
        else:
            self._blob(reference)

    def _record(self, body: bytes) -> None:
        with self.state.lock:
            self.state.requests.append(Recorded(self.command, self.path, dict(self.headers),
                                                body))

    def _issue_token(self, scope: str, key: str) -> None:
        token = secrets.token_hex(8)
        with self.state.lock:
            self.state.issued_tokens[token] = scope
        if self.state.token_body is not None:
            self._send(200, self.state.token_body, {"Content-Type": "application/json"})
            return
        reply: dict[str, object] = {key: token}
        if self.state.token_expires_in is not None:
            reply["expires_in"] = self.state.token_expires_in
        self._send(200, json.dumps(reply).encode(), {"Content-Type": "application/json"})

    def _basic_user(self) -> str | None:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return None
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        return user if self.state.users.get(user) == password else ""

    def _token(self, query: str) -> None:
        if self.state.token_get_refused:
            self._send(405, b"")
            return
        with self.state.lock:
            if self.state.token_fail_503 > 0:
                self.state.token_fail_503 -= 1
                self._send(503, b"")
                return
        params = {k: v[0] for k, v in parse_qs(query).items()}
        user = self._basic_user()
        if user == "" or (user is None and not self.state.anonymous_pull):
            self._send(401, b'{"details":"incorrect username or password"}')
            return
        self._issue_token(params.get("scope", ""), "token")

    def _authorized(self, path: str) -> bool:
        state = self.state
        if state.forbid and path != "/v2/":
            self._send(403, _errors("DENIED", "requested access to the resource is denied"))
            return False
        header = self.headers.get("Authorization", "")
        if state.auth == "bearer":
            scope = ""
            match = re.match(r"/v2/(.+)/(?:manifests|blobs)/", path)
            if match:
                scope = f"repository:{match.group(1)}:pull"
            token = header[7:] if header.startswith("Bearer ") else None
            with state.lock:
                granted = state.issued_tokens.get(token or "") if state.accept_tokens else None
            if granted is None or (scope and granted != scope):
                challenge = (f'Bearer realm="{state.token_realm or state.base_url + "/token"}",'
                             f'service="{state.netloc}"')
                if scope:
                    challenge += f',scope="{scope}"'
                self._send(401, _errors("UNAUTHORIZED", "authentication required"),
                           {"WWW-Authenticate": challenge})
                return False
        elif state.auth == "basic" and not self._basic_user():
            self._send(401, _errors("UNAUTHORIZED", "authentication required"),
                       {"WWW-Authenticate": 'Basic realm="fake, with comma"'})
            return False
        return True

    def _manifest(self, repository: str, reference: str) -> None:
        entry = self.state.manifests.get((repository, reference))
        if entry is None:
            self._send(404, self.state.error_body or _errors("MANIFEST_UNKNOWN",
                                                             "manifest unknown"),
                       {"Content-Type": "application/json"})
            return
        media_type, data = entry
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if self.state.wrong_digest_header:
            digest = "sha256:" + "0" * 64
        self._send(200, data, {"Content-Type": self.state.content_type or media_type,
                               "Docker-Content-Digest": digest})

    def _blob(self, digest: str) -> None:
        state = self.state
        data = state.blobs.get(digest)
        if data is None:
            self._send(404, _errors("BLOB_UNKNOWN", "blob unknown to registry"))
            return
        if state.redirect_blobs_to:
            self._send(307, b"", {"Location": f"{state.redirect_blobs_to}{self.path}"})
            return
        if state.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        status = 200
        headers = {"Content-Type": "application/octet-stream", "Docker-Content-Digest": digest}
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if match and not state.ignore_range:
            start = int(match.group(1))
            if start >= len(data):
                self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                return
            status = 206
            shown = start + 1 if state.wrong_range_start else start
            headers["Content-Range"] = f"bytes {shown}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        with state.lock:
            drop = state.drop_after if state.drop_times > 0 else None
            if drop is not None:
                state.drop_times -= 1
            stall = state.stall_after if state.stall_times > 0 else None
            if stall is not None:
                state.stall_times -= 1
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if state.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = drop if drop is not None else stall
        sent = body[:cut] if cut is not None else body
        if state.chunked:
            if sent:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(sent), sent))
            if cut is None:
                self.wfile.write(b"0\r\n\r\n")
        else:
            self.wfile.write(sent)
        if cut is None:
            return
        self.wfile.flush()
        if stall is not None:
            time.sleep(state.stall_seconds)
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: FakeRegistry

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # dropped connections and TLS probes are part of the tests


@contextmanager
def serve(state: FakeRegistry | None = None, *,
          tls: tuple[str, str] | None = None) -> Iterator[FakeRegistry]:
    """Run a fake registry on 127.0.0.1:<free port>; ``tls`` = (certfile, keyfile)."""
    registry = state if state is not None else FakeRegistry()
    server = _Server(("127.0.0.1", 0), _Handler)
    server.state = registry
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    registry.netloc = f"127.0.0.1:{port}"
    registry.base_url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# -- helpers for the tests that drive the real client against this server ------------------


class MemorySink:
    """A BlobSink holding bytes in memory; counts restarts and chunk sizes."""

    def __init__(self, initial: bytes = b"") -> None:
        self.data = bytearray(initial)
        self.restarts = 0
        self.chunk_sizes: list[int] = []

    @property
    def offset(self) -> int:
        return len(self.data)

    def write(self, chunk: bytes) -> None:
        self.chunk_sizes.append(len(chunk))
        self.data += chunk

    def restart(self) -> None:
        self.restarts += 1
        self.data.clear()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def self_signed_cert(directory: Path) -> tuple[str, str]:
    """(certfile, keyfile) for 127.0.0.1, made with the openssl command."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return str(cert), str(key)
