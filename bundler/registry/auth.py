"""Registry authentication: ``WWW-Authenticate`` parsing, bearer tokens, basic auth.

Auth is a generator flow (the httpx shape): :meth:`Authenticator.flow` yields the request to
send and receives its response. A ``401`` with a ``Bearer`` challenge is answered by yielding a
token request to the challenge's realm (anonymous, basic-authenticated with stored credentials,
or an OAuth2 ``refresh_token`` POST for an identity token; an issuer that refuses the GET is
asked with an OAuth2 ``password`` POST), then yielding the original request
again with ``Authorization: Bearer``. A ``Basic`` challenge is answered with the stored
credentials. The response the flow last received when it stops is the final one; if the token
issuer answers 429/5xx the flow stops there, so the caller's retry policy sees that status.

Tokens are cached per (realm, service, scope, account) until ``expires_in`` (default 60 s).
"""

from __future__ import annotations

import base64
import re
import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit

import requests

from ocistage.bundler.registry.errors import AuthenticationError
from ocistage.bundler.registry.transport import HttpRequest, origin_of
from ocistage.cache.jsondoc import parse_json

if TYPE_CHECKING:  # the credential files are read by the client's store, on a challenge
    from ocistage.bundler.registry.credentials import Credentials

DEFAULT_TOKEN_LIFETIME = 60.0
TOKEN_BODY_LIMIT = 1 << 20
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
CLIENT_ID = "ocistage"

AuthFlow = Generator[HttpRequest, requests.Response, None]
BodyReader = Callable[[requests.Response, int], bytes | None]
CredentialLookup = Callable[[str | None], "Credentials | None"]

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_SPACE = re.compile(r"[ \t]*")


@dataclass(frozen=True)
class Challenge:
    """One challenge of a ``WWW-Authenticate`` header; ``scheme`` is lower-case."""

    scheme: str
    params: Mapping[str, str] = field(default_factory=dict)

    @property
    def realm(self) -> str | None:
        return self.params.get("realm")

    @property
    def service(self) -> str | None:
        return self.params.get("service")

    @property
    def scope(self) -> str | None:
        return self.params.get("scope")


def _quoted(header: str, pos: int) -> tuple[str, int]:
    """A quoted-string starting at ``header[pos] == '"'``: its value and the end position."""
    out: list[str] = []
    pos += 1
    while pos < len(header):
        char = header[pos]
        if char == "\\" and pos + 1 < len(header):
            out.append(header[pos + 1])
            pos += 2
            continue
        if char == '"':
            return "".join(out), pos + 1
        out.append(char)
        pos += 1
    return "".join(out), pos


def parse_www_authenticate(header: str) -> list[Challenge]:
    """All challenges in a header, e.g. ``Bearer realm="…",scope="repository:a:pull,push"``.

    Quoted strings may hold commas and escaped quotes; parameter names are lower-cased;
    unparseable tails are skipped rather than fatal.
    """
    challenges: list[tuple[str, dict[str, str]]] = []
    pos = 0
    while pos < len(header):
        if header[pos] in ", \t":
            pos += 1
            continue
        match = _TOKEN.match(header, pos)
        if match is None:
            pos += 1
            continue
        name = match.group()
        after = _SPACE.match(header, match.end())
        nxt = after.end() if after else match.end()
        if nxt < len(header) and header[nxt] == "=" and challenges:
            pos = _SPACE.match(header, nxt + 1).end()  # type: ignore[union-attr]
            if pos < len(header) and header[pos] == '"':
                value, pos = _quoted(header, pos)
            else:
                token = _TOKEN.match(header, pos)
                if token is None:  # token68 (``abc==``) or malformed: skip it
                    while pos < len(header) and header[pos] not in ", \t":
                        pos += 1
                    continue
                value, pos = token.group(), token.end()
            challenges[-1][1].setdefault(name.lower(), value)
        else:
            challenges.append((name.lower(), {}))
            pos = match.end()
    return [Challenge(scheme, params) for scheme, params in challenges]


class TokenCache:
    """Bearer tokens by (realm, service, scope, account), valid until their expiry."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tokens: dict[tuple[str, str, str, str], tuple[str, float]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str, str]) -> str | None:
        with self._lock:
            entry = self._tokens.get(key)
            if entry is None:
                return None
            if self._clock() >= entry[1]:
                del self._tokens[key]
                return None
            return entry[0]

    def put(self, key: tuple[str, str, str, str], token: str, lifetime: float) -> None:
        with self._lock:
            self._tokens[key] = (token, self._clock() + lifetime)

    def drop(self, key: tuple[str, str, str, str]) -> None:
        with self._lock:
            self._tokens.pop(key, None)


def repository_of(scope: str | None) -> str | None:
    """``repository:a/b:pull`` -> ``a/b``."""
    if scope is None or not scope.startswith("repository:"):
        return None
    return scope[len("repository:"):].rpartition(":")[0] or None


def credentials_may_go_to(url: str, registry_url: str) -> bool:
    """Whether credentials for the registry at ``registry_url`` may be sent to ``url``: over
    https, or to the registry's own origin (scheme, host and port). A registry the user lets
    us reach over plain HTTP (insecure, loopback) may name a plain-HTTP realm on its own host;
    an https registry never sends them to plain HTTP elsewhere."""
    target, registry = origin_of(url), origin_of(registry_url)
    if target[0] == "https" or target == registry:
        return True
    return registry[0] == "http" and target[0] == "http" and target[1] == registry[1]


def basic_header(credentials: Credentials) -> str:
    pair = f"{credentials.username}:{credentials.password}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


class Authenticator:
    """Authentication for one registry host (``name`` is ``host[:port]``, used in messages).

    ``lookup(repository)`` finds stored credentials; it is called only once a registry asks
    for authentication (so credential helpers do not run for anonymous registries), and its
    answers are remembered per repository.
    """

    def __init__(self, name: str, lookup: CredentialLookup, tokens: TokenCache,
                 read_body: BodyReader) -> None:
        self.name = name
        self._lookup = lookup
        self._known: dict[str | None, Credentials | None] = {}
        self._lock = threading.Lock()
        self._tokens = tokens
        self._read_body = read_body
        self._bearer: Challenge | None = None  # last bearer challenge: lets us skip the 401
        self._basic = False

    def credentials(self, scope: str | None) -> Credentials | None:
        repository = repository_of(scope)
        with self._lock:
            if repository not in self._known:
                self._known[repository] = self._lookup(repository)
            return self._known[repository]

    def _token_key(self, challenge: Challenge, scope: str | None) -> tuple[str, str, str, str]:
        creds = self.credentials(scope)
        account = creds.username if creds else ""
        return (challenge.realm or "", challenge.service or "", scope or "", account)

    def _preemptive(self, request: HttpRequest) -> tuple[str | None, Challenge | None]:
        if self._basic:
            creds = self.credentials(request.scope)
            if creds is not None and creds.password:
                return basic_header(creds), None
        bearer = self._bearer
        if bearer is not None:
            token = self._tokens.get(self._token_key(bearer, request.scope))
            if token is not None:
                return f"Bearer {token}", bearer
        return None, None

    def flow(self, request: HttpRequest) -> AuthFlow:
        """Yield requests, receive their responses; stop after the final response."""
        header, cached_from = self._preemptive(request)
        if header is None and self._bearer is not None:
            token = yield from self._fetch_token(self._bearer, request.scope, request.url)
            if token is None:
                return
            header, cached_from = f"Bearer {token}", self._bearer
        response = yield request.with_headers({"Authorization": header}) if header else request
        if response.status_code != 401:
            return
        if cached_from is not None:  # the token may have been revoked: forget it, ask again
            self._tokens.drop(self._token_key(cached_from, request.scope))
        elif header is not None:
            raise self._rejected(request.scope)
        header = yield from self._answer_challenge(request, response)
        if header is None:
            return
        response = yield request.with_headers({"Authorization": header})
        if response.status_code == 401:
            raise self._rejected(request.scope)

    def _answer_challenge(self, request: HttpRequest, response: requests.Response
                          ) -> Generator[HttpRequest, requests.Response, str | None]:
        """The Authorization header answering the challenge of the 401 ``response`` to
        ``request``; None if the token issuer asks to retry."""
        challenges = parse_www_authenticate(response.headers.get("WWW-Authenticate", ""))
        bearer = next((c for c in challenges if c.scheme == "bearer"), None)
        if bearer is not None:
            self._bearer = bearer
            token = yield from self._fetch_token(bearer, request.scope, request.url)
            return None if token is None else f"Bearer {token}"
        if any(c.scheme == "basic" for c in challenges):
            creds = self.credentials(request.scope)
            if creds is None or not creds.password:
                raise AuthenticationError(f"{self.name} requires a login (basic auth) and no "
                                          "credentials are stored for it")
            self._basic = True
            return basic_header(creds)
        raise AuthenticationError(f"{self.name} answered 401 Unauthorized without a "
                                  "challenge this client supports")

    def _rejected(self, scope: str | None) -> AuthenticationError:
        creds = self.credentials(scope)
        if creds is None:
            return AuthenticationError(f"{self.name} refused anonymous access (401 Unauthorized)")
        who = creds.username or "the identity token"
        return AuthenticationError(f"{self.name} rejected the credentials of {who} "
                                   "(401 Unauthorized)")

    def _token_request(self, challenge: Challenge, scope: str | None,
                       creds: Credentials | None) -> HttpRequest:
        realm = challenge.realm or ""
        if urlsplit(realm).scheme not in ("http", "https"):
            raise AuthenticationError(f"{self.name} sent a bearer challenge with an unusable "
                                      f"realm {realm!r}", hint="the registry is misconfigured")
        query: dict[str, str] = {}
        if challenge.service:
            query["service"] = challenge.service
        if scope:
            query["scope"] = scope
        if creds is not None and creds.identity_token:
            form = {**query, "grant_type": "refresh_token", "client_id": CLIENT_ID,
                    "refresh_token": creds.identity_token}
            return HttpRequest("POST", realm, {"Accept": "application/json"}, data=form)
        headers = {"Accept": "application/json"}
        if creds is not None and creds.password:
            query["account"] = creds.username
            headers["Authorization"] = basic_header(creds)
        sep = "&" if urlsplit(realm).query else "?"
        url = f"{realm}{sep}{urlencode(query)}" if query else realm
        return HttpRequest("GET", url, headers)

    @staticmethod
    def _password_grant(challenge: Challenge, scope: str | None,
                        creds: Credentials) -> HttpRequest:
        form = {"grant_type": "password", "client_id": CLIENT_ID,
                "username": creds.username, "password": creds.password}
        if challenge.service:
            form["service"] = challenge.service
        if scope:
            form["scope"] = scope
        return HttpRequest("POST", challenge.realm or "", {"Accept": "application/json"},
                           data=form)

    def _fetch_token(self, challenge: Challenge, request_scope: str | None, registry_url: str,
                     ) -> Generator[HttpRequest, requests.Response, str | None]:
        """A bearer token for the scope (cached or fetched); None if the issuer asks to retry.

        Stored credentials go only to a realm on the registry's own origin or over https:
        to a plain-HTTP realm elsewhere the token is asked for anonymously.
        """
        scope = request_scope or challenge.scope
        key = self._token_key(challenge, scope)
        cached = self._tokens.get(key)
        if cached is not None:
            return cached
        creds = self.credentials(scope)
        withheld = creds is not None and not credentials_may_go_to(challenge.realm or "",
                                                                   registry_url)
        if withheld:
            creds = None
        request = self._token_request(challenge, scope, creds)
        response = yield request
        status = response.status_code
        if status in (404, 405) and request.method == "GET" and creds and creds.password:
            # some issuers only speak the OAuth2 form: retry as a password grant
            response = yield self._password_grant(challenge, scope, creds)
            status = response.status_code
        if status in RETRYABLE_STATUS:
            return None
        issuer = urlsplit(challenge.realm or "").netloc
        if status != 200:
            response.close()
            raise self._token_refused(issuer, status, scope, withheld)
        body = self._read_body(response, TOKEN_BODY_LIMIT)
        token, lifetime = _parse_token(body, issuer)
        self._tokens.put(key, token, lifetime)
        return token

    def _token_refused(self, issuer: str, status: int, scope: str | None,
                       withheld: bool) -> AuthenticationError:
        """The error for a token request that ``issuer`` answered with HTTP ``status``
        (``withheld``: the stored credentials were not sent to it)."""
        if status not in (401, 403):
            return AuthenticationError(f"token request for {self.name} to {issuer} failed "
                                       f"with HTTP {status}",
                                       hint="the registry's token service is failing; "
                                            "retry later")
        if withheld:
            return AuthenticationError(
                f"{self.name}: token issuer {issuer} refused anonymous access (HTTP "
                f"{status}); the stored credentials were not sent to it because it is "
                f"plain HTTP on another origin",
                hint="the registry's token realm must be https (or on the registry's "
                     "own host) for credentials to be sent")
        return self._rejected_by_issuer(issuer, status, scope)

    def _rejected_by_issuer(self, issuer: str, status: int,
                            scope: str | None) -> AuthenticationError:
        creds = self.credentials(scope)
        if creds is None:
            return AuthenticationError(f"{self.name}: token issuer {issuer} refused anonymous "
                                       f"access (HTTP {status})")
        who = creds.username or "the identity token"
        return AuthenticationError(f"{self.name}: token issuer {issuer} rejected the credentials "
                                   f"of {who} (HTTP {status})")


def _parse_token(body: bytes | None, issuer: str) -> tuple[str, float]:
    """(token, lifetime in seconds) from a token endpoint's JSON reply."""
    try:
        if body is None:
            raise ValueError("reply too large")
        document = parse_json(body)
        token = document.get("token") or document.get("access_token")
        if not isinstance(token, str) or not token:
            raise ValueError("no token in reply")
        expires = document.get("expires_in", DEFAULT_TOKEN_LIFETIME)
        lifetime = float(expires) if isinstance(expires, int | float) and expires > 0 \
            else DEFAULT_TOKEN_LIFETIME
    except (ValueError, AttributeError) as exc:
        raise AuthenticationError(f"token issuer {issuer} sent an unusable reply: {exc}",
                                  hint="the registry's token service is misbehaving") from exc
    return token, lifetime
