"""WWW-Authenticate parsing, the token cache, and the auth flows against a real HTTP server."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from ocistage.bundler.registry.auth import (
    Challenge,
    TokenCache,
    credentials_may_go_to,
    parse_www_authenticate,
    repository_of,
)
from ocistage.bundler.registry.client import RegistryClient, RegistryConfig
from ocistage.bundler.registry.credentials import CredentialStore
from ocistage.bundler.registry.errors import AuthenticationError
from ocistage.cache.digest import Digest
from tests.bundler.fakeregistry import FakeRegistry, MemorySink, self_signed_cert, serve

ACCEPT = ["application/vnd.oci.image.manifest.v1+json"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- parsing ----------------------------------------------------------------------------


def test_parse_bearer_with_commas_in_quotes() -> None:
    header = ('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
              'scope="repository:samalba/my-app:pull,push"')
    assert parse_www_authenticate(header) == [Challenge("bearer", {
        "realm": "https://auth.docker.io/token", "service": "registry.docker.io",
        "scope": "repository:samalba/my-app:pull,push"})]


def test_parse_several_challenges_escapes_and_spacing() -> None:
    header = ('Basic realm="say \\"hi\\", please" , BEARER Realm = "https://a/t" ,'
              'service=tok_en, error="invalid_token"')
    basic, bearer = parse_www_authenticate(header)
    assert basic == Challenge("basic", {"realm": 'say "hi", please'})
    assert bearer.scheme == "bearer"
    assert bearer.realm == "https://a/t"
    assert bearer.service == "tok_en"
    assert bearer.params["error"] == "invalid_token"


def test_parse_odd_input_does_not_crash() -> None:
    assert parse_www_authenticate("") == []
    assert parse_www_authenticate("Negotiate abc123==") == [Challenge("negotiate", {})]
    assert parse_www_authenticate('Bearer realm="unterminated') == [
        Challenge("bearer", {"realm": "unterminated"})]
    assert parse_www_authenticate("Basic") == [Challenge("basic", {})]


def test_repository_of_scope() -> None:
    assert repository_of("repository:library/alpine:pull") == "library/alpine"
    assert repository_of("repository:a/b:pull,push") == "a/b"
    assert repository_of(None) is None
    assert repository_of("registry:catalog:*") is None


def test_token_cache_expires() -> None:
    clock = Clock()
    cache = TokenCache(clock)
    key = ("realm", "svc", "repository:a:pull", "")
    cache.put(key, "tok", 60)
    clock.now += 59
    assert cache.get(key) == "tok"
    clock.now += 1
    assert cache.get(key) is None
    cache.put(key, "tok2", 60)
    cache.drop(key)
    assert cache.get(key) is None


# -- flows against the fake registry -----------------------------------------------------


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    with serve() as state:
        state.add_manifest("team/app", "latest", b'{"schemaVersion":2,"layers":[]}')
        state.add_manifest("team/other", "v1", b'{"schemaVersion":2}')
        yield state


def _store(tmp_path: Path, netloc: str, entry: dict[str, str] | None) -> CredentialStore:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"auths": {netloc: entry} if entry else {}}))
    return CredentialStore([path])


def _client(registry: FakeRegistry, tmp_path: Path, entry: dict[str, str] | None = None,
            clock: Clock | None = None) -> RegistryClient:
    config = RegistryConfig(credentials=_store(tmp_path, registry.netloc, entry))
    return RegistryClient(registry.netloc, config, sleep=lambda _: None,
                          clock=clock or Clock())


def _auth(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_anonymous_bearer_token_is_fetched_once_per_scope(registry: FakeRegistry,
                                                          tmp_path: Path) -> None:
    registry.auth = "bearer"
    digest = registry.add_blob(b"layer")
    with _client(registry, tmp_path) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
        sink = MemorySink()
        client.fetch_blob("team/app", Digest.parse(digest), 5, sink)
        client.get_manifest("team/app", "latest", ACCEPT)
        assert bytes(sink.data) == b"layer"
        tokens = registry.token_requests()
        assert len(tokens) == 1
        query = parse_qs(urlsplit(tokens[0].path).query)
        assert query == {"service": [registry.netloc], "scope": ["repository:team/app:pull"]}
        assert "Authorization" not in tokens[0].headers
        client.get_manifest("team/other", "v1", ACCEPT)
        assert len(registry.token_requests()) == 2
        # the second repository's token was fetched without another 401 round trip
        assert registry.paths("/v2/team/other") == ["/v2/team/other/manifests/v1"]


def test_token_reused_until_expires_in(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.auth = "bearer"
    registry.token_expires_in = 300
    clock = Clock()
    with _client(registry, tmp_path, clock=clock) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
        clock.now += 299
        client.get_manifest("team/app", "latest", ACCEPT)
        assert len(registry.token_requests()) == 1
        clock.now += 2
        client.get_manifest("team/app", "latest", ACCEPT)
        assert len(registry.token_requests()) == 2


def test_token_lifetime_defaults_to_60_seconds(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.auth = "bearer"
    registry.token_expires_in = None
    clock = Clock()
    with _client(registry, tmp_path, clock=clock) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
        clock.now += 59
        client.get_manifest("team/app", "latest", ACCEPT)
        assert len(registry.token_requests()) == 1
        clock.now += 2
        client.get_manifest("team/app", "latest", ACCEPT)
        assert len(registry.token_requests()) == 2


def test_revoked_token_is_fetched_again(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.auth = "bearer"
    with _client(registry, tmp_path) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
        registry.issued_tokens.clear()
        client.get_manifest("team/app", "latest", ACCEPT)
        assert len(registry.token_requests()) == 2


def test_bearer_with_credentials_sends_basic_to_the_token_endpoint(
        registry: FakeRegistry, tmp_path: Path) -> None:
    registry.auth = "bearer"
    registry.anonymous_pull = False
    registry.users = {"alice": "pw"}
    with _client(registry, tmp_path, _auth("alice", "pw")) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
    (token,) = registry.token_requests()
    assert token.headers["Authorization"] == "Basic " + base64.b64encode(b"alice:pw").decode()
    assert parse_qs(urlsplit(token.path).query)["account"] == ["alice"]


def test_wrong_credentials_name_the_registry(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.auth = "bearer"
    registry.users = {"alice": "pw"}
    with _client(registry, tmp_path, _auth("alice", "nope")) as client, \
            pytest.raises(AuthenticationError, match=registry.netloc) as caught:
        client.get_manifest("team/app", "latest", ACCEPT)
    assert "alice" in caught.value.message
    assert caught.value.hint


def test_anonymous_refused(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.auth = "bearer"
    registry.anonymous_pull = False
    with _client(registry, tmp_path) as client, \
            pytest.raises(AuthenticationError, match="anonymous"):
        client.get_manifest("team/app", "latest", ACCEPT)


def test_identity_token_uses_oauth2_refresh_post(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.auth = "bearer"
    registry.anonymous_pull = False
    registry.refresh_tokens = {"refresh-123": "alice"}
    entry = {"auth": base64.b64encode(b"alice:").decode(), "identitytoken": "refresh-123"}
    with _client(registry, tmp_path, entry) as client:
        manifest = client.get_manifest("team/app", "latest", ACCEPT)
    assert manifest.data.startswith(b"{")
    (token,) = registry.token_requests()
    assert token.method == "POST"
    form = parse_qs(token.body.decode())
    assert form["grant_type"] == ["refresh_token"]
    assert form["refresh_token"] == ["refresh-123"]
    assert form["scope"] == ["repository:team/app:pull"]
    assert form["service"] == [registry.netloc]


def test_token_endpoint_failure_is_retried(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.auth = "bearer"
    registry.token_fail_503 = 2
    with _client(registry, tmp_path) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
    assert len(registry.token_requests()) == 3


def test_basic_auth_challenge(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.auth = "basic"
    registry.users = {"bob": "secret"}
    with _client(registry, tmp_path, _auth("bob", "secret")) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
        client.get_manifest("team/other", "v1", ACCEPT)
    # after the first challenge, credentials are sent up front
    assert registry.paths("/v2/team") == ["/v2/team/app/manifests/latest",
                                          "/v2/team/app/manifests/latest",
                                          "/v2/team/other/manifests/v1"]
    assert registry.token_requests() == []


def test_basic_auth_without_or_with_wrong_credentials(registry: FakeRegistry,
                                                      tmp_path: Path) -> None:
    registry.auth = "basic"
    registry.users = {"bob": "secret"}
    with _client(registry, tmp_path) as client, \
            pytest.raises(AuthenticationError, match="requires a login"):
        client.get_manifest("team/app", "latest", ACCEPT)
    with _client(registry, tmp_path, _auth("bob", "wrong")) as client, \
            pytest.raises(AuthenticationError, match=f"{registry.netloc} rejected"):
        client.get_manifest("team/app", "latest", ACCEPT)


def test_forbidden_is_an_authentication_error(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.forbid = True
    with _client(registry, tmp_path) as client, \
            pytest.raises(AuthenticationError, match=f"{registry.netloc} denied access"
                                                     ".*team/app:latest.*DENIED"):
        client.get_manifest("team/app", "latest", ACCEPT)


def test_rejected_token_is_an_authentication_error(registry: FakeRegistry,
                                                   tmp_path: Path) -> None:
    registry.auth = "bearer"
    registry.accept_tokens = False
    with _client(registry, tmp_path) as client, \
            pytest.raises(AuthenticationError, match=f"{registry.netloc} refused anonymous"):
        client.get_manifest("team/app", "latest", ACCEPT)


def test_password_grant_when_the_issuer_refuses_get(registry: FakeRegistry,
                                                    tmp_path: Path) -> None:
    registry.auth = "bearer"
    registry.token_get_refused = True
    registry.users = {"alice": "pw"}
    with _client(registry, tmp_path, _auth("alice", "pw")) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
    get, post = registry.token_requests()
    assert (get.method, post.method) == ("GET", "POST")
    form = parse_qs(post.body.decode())
    assert form["grant_type"] == ["password"]
    assert form["username"] == ["alice"]
    assert form["scope"] == ["repository:team/app:pull"]
    with _client(registry, tmp_path, _auth("alice", "bad")) as client, \
            pytest.raises(AuthenticationError, match="rejected the credentials of alice"):
        client.get_manifest("team/app", "latest", ACCEPT)


# -- credentials and the token realm's origin ---------------------------------------------------


@pytest.fixture
def https_registry_with_http_realm(tmp_path: Path) -> Iterator[tuple[FakeRegistry,
                                                                      FakeRegistry]]:
    """An https registry whose bearer realm is a plain-HTTP token issuer on another port."""
    (tmp_path / "tls").mkdir()
    certificate = self_signed_cert(tmp_path / "tls")
    with serve(tls=certificate) as registry, serve() as issuer:
        registry.add_manifest("team/app", "latest", b'{"schemaVersion":2,"layers":[]}')
        registry.auth = "bearer"
        registry.token_realm = f"{issuer.base_url}/token"
        issuer.issued_tokens = registry.issued_tokens  # tokens the registry accepts
        issuer.users = {"alice": "secret"}
        yield registry, issuer


def test_credentials_are_not_sent_to_a_plain_http_realm_elsewhere(
        https_registry_with_http_realm: tuple[FakeRegistry, FakeRegistry],
        tmp_path: Path) -> None:
    registry, issuer = https_registry_with_http_realm
    with _client(registry, tmp_path, _auth("alice", "secret")) as client:
        client.get_manifest("team/app", "latest", ACCEPT)  # an anonymous token is enough
    asked = issuer.token_requests()
    assert asked and all("Authorization" not in r.headers for r in asked)
    assert all("secret" not in r.path and b"secret" not in r.body for r in asked)
    issuer.anonymous_pull = False
    registry.issued_tokens.clear()
    with _client(registry, tmp_path, _auth("alice", "secret")) as client, \
            pytest.raises(AuthenticationError, match="credentials were not sent"):
        client.get_manifest("team/app", "latest", ACCEPT)
    assert all("Authorization" not in r.headers for r in issuer.token_requests())


def test_credentials_may_go_to_https_or_the_same_origin() -> None:
    registry = "https://registry.example"
    assert credentials_may_go_to("https://auth.example/token", registry)
    assert credentials_may_go_to("https://registry.example:443/token", registry)
    assert not credentials_may_go_to("http://auth.example/token", registry)
    assert not credentials_may_go_to("http://registry.example/token", registry)  # :80 != :443
    assert credentials_may_go_to("http://127.0.0.1:5000/token", "http://127.0.0.1:5000/v2/")
    # a plain-HTTP registry (insecure, loopback): a plain-HTTP realm on its own host only
    assert credentials_may_go_to("http://127.0.0.1:5001/token", "http://127.0.0.1:5000/v2/")
    assert not credentials_may_go_to("http://10.0.0.9/token", "http://127.0.0.1:5000/v2/")
    assert not credentials_may_go_to("http://127.0.0.1:5001/token", "https://127.0.0.1:5000/")
