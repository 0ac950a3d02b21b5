"""A tiny registry token issuer (the "realm" of Docker's token authentication).

``GET /token?service=S&scope=repository:NAME:pull,push`` with optional Basic credentials answers
``{"token": JWT, "access_token": JWT, "expires_in": N, "issued_at": ...}``. The JWT is RS256,
signed with a key whose self-signed certificate is the registry's ``rootcertbundle``; the
certificate travels in the ``x5c`` header, which distribution verifies against that bundle.

Policy: repositories in ``public`` (a name, or every name under one ending in ``/``) can be
pulled by anyone; every other action needs valid credentials. Like Docker Hub, an anonymous
request for a private repository still gets a token, but one that grants nothing, so the
registry answers 401 ``insufficient_scope``. Wrong credentials get 401 from the issuer itself.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from pytest_ocistage.components import SigningKey

TOKEN_LIFETIME = 300


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def pem_to_der(pem: str) -> bytes:
    body = "".join(line for line in pem.splitlines() if line and not line.startswith("-----"))
    return base64.b64decode(body)


def sign_rs256(key: Path, data: bytes) -> bytes:
    """RSASSA-PKCS1-v1_5 with SHA-256, done by the openssl binary."""
    result = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(key)], input=data,
                            capture_output=True, check=True, timeout=30)
    return result.stdout


def parse_scope(scope: str) -> tuple[str, str, list[str]] | None:
    """``repository:name:pull,push`` -> (type, name, actions); None when malformed."""
    kind, sep, rest = scope.partition(":")
    name, sep2, actions = rest.rpartition(":")
    if not sep or not sep2 or not name:
        return None
    return kind, name, [a for a in actions.split(",") if a]


@dataclass(frozen=True)
class IssuedRequest:
    """What the issuer saw: the account (None: anonymous), scopes asked and access granted."""

    account: str | None
    service: str | None
    scopes: tuple[str, ...]
    granted: tuple[tuple[str, tuple[str, ...]], ...]
    status: int


@dataclass
class TokenPolicy:
    signing_key: SigningKey
    issuer: str
    service: str
    users: dict[str, str]
    public: frozenset[str]
    lifetime: int = TOKEN_LIFETIME
    log: list[IssuedRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def grant(self, account: str | None, kind: str, name: str,
              actions: list[str]) -> list[str]:
        if kind != "repository":
            return []
        if account is not None:
            return [a for a in actions if a in ("pull", "push", "delete", "*")]
        if any(name == entry or (entry.endswith("/") and name.startswith(entry))
               for entry in self.public):
            return [a for a in actions if a == "pull"]
        return []

    def make_token(self, account: str | None, access: list[dict[str, object]]) -> str:
        cert_der = pem_to_der(self.signing_key.cert.read_text())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(cert_der).decode()]}
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": account or "", "aud": self.service,
                  "exp": now + self.lifetime, "nbf": now - 10, "iat": now,
                  "jti": secrets.token_hex(8), "access": access}
        signing_input = (b64url(json.dumps(header).encode()) + "."
                         + b64url(json.dumps(claims).encode()))
        signature = sign_rs256(self.signing_key.key, signing_input.encode("ascii"))
        return signing_input + "." + b64url(signature)

    def record(self, entry: IssuedRequest) -> None:
        with self.lock:
            self.log.append(entry)


class _Handler(BaseHTTPRequestHandler):
    server: _IssuerServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _credentials(self) -> tuple[str, str] | None:
        header = self.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return ("", "")
        return (user, password)

    def _send_json(self, status: int, body: dict[str, object],
                   extra: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        policy = self.server.policy
        url = urlsplit(self.path)
        if url.path != "/token":
            self._send_json(404, {"details": "not found"})
            return
        query = parse_qs(url.query)
        scopes = tuple(s for value in query.get("scope", []) for s in value.split(" ") if s)
        service = query.get("service", [None])[0]
        credentials = self._credentials()
        account: str | None = None
        if credentials is not None:
            user, password = credentials
            if policy.users.get(user) != password or not user:
                policy.record(IssuedRequest(user, service, scopes, (), 401))
                self._send_json(401, {"details": "invalid credentials"},
                                {"WWW-Authenticate": 'Basic realm="ocistage-test-issuer"'})
                return
            account = user
        access: list[dict[str, object]] = []
        granted: list[tuple[str, tuple[str, ...]]] = []
        for scope in scopes:
            parsed = parse_scope(scope)
            if parsed is None:
                self._send_json(400, {"details": f"malformed scope {scope!r}"})
                return
            kind, name, actions = parsed
            allowed = policy.grant(account, kind, name, actions)
            if allowed:
                access.append({"type": kind, "name": name, "actions": allowed})
                granted.append((name, tuple(allowed)))
        token = policy.make_token(account, access)
        policy.record(IssuedRequest(account, service, scopes, tuple(granted), 200))
        issued_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._send_json(200, {"token": token, "access_token": token,
                              "expires_in": policy.lifetime, "issued_at": issued_at})


class _IssuerServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, policy: TokenPolicy) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.policy = policy


@dataclass(frozen=True)
class TokenIssuer:
    """A running issuer: its realm URL and the policy (whose ``log`` records every request)."""

    realm: str
    policy: TokenPolicy

    @property
    def requests(self) -> list[IssuedRequest]:
        with self.policy.lock:
            return list(self.policy.log)


@contextmanager
def running_token_issuer(signing_key: SigningKey, *, issuer: str, service: str,
                         users: dict[str, str], public: frozenset[str]) -> Iterator[TokenIssuer]:
    policy = TokenPolicy(signing_key=signing_key, issuer=issuer, service=service,
                         users=dict(users), public=public)
    server = _IssuerServer(policy)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="token-issuer",
                              daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield TokenIssuer(realm=f"http://{host!s}:{port}/token", policy=policy)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
