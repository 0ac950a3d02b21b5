"""RegistryClient policy through the real client against a real in-process HTTP registry."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest

from ocistage.bundler.image.errors import InvalidReference, UnsupportedManifest
from ocistage.bundler.registry.client import MANIFEST_LIMIT, RegistryClient, RegistryConfig
from ocistage.bundler.registry.credentials import CredentialStore
from ocistage.bundler.registry.errors import RateLimited, RegistryError, RegistryUnreachable
from ocistage.bundler.registry.names import base_urls
from ocistage.bundler.registry.responses import parse_retry_after
from ocistage.bundler.registry.transport import TlsPolicy
from ocistage.cache.digest import Digest
from ocistage.cache.store import Store
from ocistage.errors import IntegrityError, NotFound
from tests.bundler.fakeregistry import (
    FakeRegistry,
    MemorySink,
    free_port,
    self_signed_cert,
    serve,
)

ACCEPT = ["application/vnd.oci.image.manifest.v1+json",
          "application/vnd.oci.image.index.v1+json"]
MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": ACCEPT[0], "layers": []}).encode()
BLOB = bytes(range(256)) * 12_000  # ~3 MiB, not all one byte value


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    with serve() as state:
        state.add_manifest("team/app", "latest", MANIFEST)
        yield state


@pytest.fixture
def storage() -> Iterator[FakeRegistry]:
    """A second server standing in for object storage that blobs are redirected to."""
    with serve() as state:
        yield state


def _client(netloc: str, sleeps: list[float] | None = None, **config: object) -> RegistryClient:
    settings = RegistryConfig(credentials=CredentialStore([]), **config)  # type: ignore[arg-type]
    return RegistryClient(netloc, settings,
                          sleep=sleeps.append if sleeps is not None else (lambda _: None))


def _digest(data: bytes) -> Digest:
    return Digest("sha256", hashlib.sha256(data).hexdigest())


# -- schemes and TLS ---------------------------------------------------------------------


def test_scheme_selection() -> None:
    tls = TlsPolicy(frozenset({"insecure.example:5000"}))
    assert base_urls("ghcr.io", tls) == ("ghcr.io", ["https://ghcr.io"])
    assert base_urls("docker.io", tls) == ("registry-1.docker.io",
                                           ["https://registry-1.docker.io"])
    assert base_urls("insecure.example:5000", tls)[1] == [
        "https://insecure.example:5000", "http://insecure.example:5000"]
    for loopback in ("localhost:5000", "127.0.0.1:5000", "127.1.2.3", "[::1]:5000"):
        assert base_urls(loopback, tls)[1][-1] == f"http://{loopback}"
    strict = TlsPolicy(loopback_insecure=False)
    assert base_urls("localhost:5000", strict)[1] == ["https://localhost:5000"]
    assert base_urls("http://mirror:5000/", tls) == ("mirror:5000", ["http://mirror:5000"])
    with pytest.raises(InvalidReference):
        base_urls("ftp://mirror", tls)


def test_loopback_plain_http_by_default(registry: FakeRegistry) -> None:
    with _client(registry.netloc) as client:
        client.ping()
        fetched = client.get_manifest("team/app", "latest", ACCEPT)
    assert fetched.data == MANIFEST
    assert fetched.digest == _digest(MANIFEST)
    assert fetched.media_type == ACCEPT[0]


def test_loopback_can_be_made_strict(registry: FakeRegistry) -> None:
    with _client(registry.netloc, loopback_insecure=False) as client, \
            pytest.raises(RegistryUnreachable, match="TLS"):
        client.ping()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


def test_https_with_custom_ca(certificate: tuple[str, str]) -> None:
    with serve(tls=certificate) as tls_registry:
        tls_registry.add_manifest("team/app", "latest", MANIFEST)
        with _client(tls_registry.netloc, loopback_insecure=False,
                     ca_file=certificate[0]) as client:
            assert client.get_manifest("team/app", "latest", ACCEPT).data == MANIFEST
        sleeps: list[float] = []
        with _client(tls_registry.netloc, sleeps, loopback_insecure=False) as client, \
                pytest.raises(RegistryUnreachable, match="certificate verification failed") as ex:
            client.ping()
        # another try cannot change a certificate: no retry, and the hint names --ca-file
        assert sleeps == []
        assert "--ca-file" in (ex.value.hint or "")
        assert f"--insecure-registry {tls_registry.netloc}" in (ex.value.hint or "")


def test_a_ca_file_that_does_not_sign_the_registry_is_named(certificate: tuple[str, str],
                                                           tmp_path: Path) -> None:
    other = self_signed_cert(tmp_path)[0]
    with serve(tls=certificate) as tls_registry, \
            _client(tls_registry.netloc, loopback_insecure=False, ca_file=other) as client, \
            pytest.raises(RegistryUnreachable, match="certificate verification failed") as ex:
        client.ping()
    assert f"the CA file {other} does not vouch for it" in (ex.value.hint or "")


@pytest.mark.parametrize(("content", "why"), [
    (None, "no such file or directory"),
    (b"", "no PEM certificate"),
    (b"not a certificate\n", "no PEM certificate"),
    (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "no PEM certificate"),
])
def test_a_bad_ca_file_is_a_usage_error_before_any_connection(
        content: bytes | None, why: str, tmp_path: Path) -> None:
    from ocistage.bundler.registry.errors import CaFileError

    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_bytes(content)
    sleeps: list[float] = []
    # port 9 (discard) is never asked: the file is refused when the client is made
    with pytest.raises(CaFileError, match=why) as ex:
        _client("192.0.2.1:9", sleeps, ca_file=str(path), ca_file_origin="option --ca-file")
    assert ex.value.exit_code == 2 and sleeps == []
    assert ex.value.message.startswith(f"cannot use the CA file {path} (option --ca-file): ")
    assert "--ca-file" in (ex.value.hint or "")


def test_insecure_https_is_tried_before_http(certificate: tuple[str, str]) -> None:
    with serve(tls=certificate) as tls_registry:
        tls_registry.add_manifest("team/app", "latest", MANIFEST)
        # listed insecure: the self-signed certificate is accepted without a CA
        with _client(tls_registry.netloc, loopback_insecure=False,
                     insecure_registries=frozenset({tls_registry.netloc})) as client:
            assert client.get_manifest("team/app", "latest", ACCEPT).data == MANIFEST
        assert tls_registry.paths("/v2/team") == ["/v2/team/app/manifests/latest"]


# -- errors ------------------------------------------------------------------------------


def test_connection_refused() -> None:
    sleeps: list[float] = []
    port = free_port()
    with _client(f"localhost:{port}", sleeps, max_retries=3) as client, \
            pytest.raises(RegistryUnreachable) as caught:
        client.ping()
    assert caught.value.message == f"cannot connect to localhost:{port}: connection refused"
    assert caught.value.hint
    assert len(sleeps) == 3


@pytest.mark.parametrize(("code", "tries"), [(socket.EAI_NONAME, 1), (socket.EAI_AGAIN, 4)])
def test_an_unknown_host_is_not_retried(code: int, tries: int,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS saying the name does not exist is final; a resolver that failed may recover."""
    asked: list[object] = []

    def getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        asked.append(host)
        raise socket.gaierror(code, os.strerror(1))

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    sleeps: list[float] = []
    with _client("registry.example.invalid", sleeps, max_retries=3) as client, \
            pytest.raises(RegistryUnreachable) as caught:
        client.ping()
    assert len(sleeps) == tries - 1 and len(asked) >= tries
    if code == socket.EAI_NONAME:
        assert caught.value.message == ("cannot connect to registry.example.invalid: no such "
                                        "host registry.example.invalid (DNS does not know it)")
        assert "--insecure-registry" not in str(caught.value.hint)
        assert "name" in str(caught.value.hint)


def test_not_found_names_repository_and_tag(registry: FakeRegistry) -> None:
    with _client(registry.netloc) as client:
        with pytest.raises(NotFound, match=r"team/app:nope .*MANIFEST_UNKNOWN: manifest unknown"):
            client.get_manifest("team/app", "nope", ACCEPT)
        with pytest.raises(NotFound, match="BLOB_UNKNOWN"):
            client.fetch_blob("team/app", _digest(b"missing"), 7, MemorySink())


def test_invalid_names_never_reach_the_network(registry: FakeRegistry) -> None:
    with _client(registry.netloc) as client:
        for bad in ("../etc", "Team/App", "a//b", "a/b/"):
            with pytest.raises(InvalidReference):
                client.get_manifest(bad, "latest", ACCEPT)
        with pytest.raises(InvalidReference):
            client.get_manifest("team/app", "bad/tag", ACCEPT)
    assert registry.requests == []


# -- manifests ---------------------------------------------------------------------------


def test_manifest_by_digest_is_verified(registry: FakeRegistry) -> None:
    digest = _digest(MANIFEST)
    with _client(registry.netloc) as client:
        assert client.get_manifest("team/app", str(digest), ACCEPT).digest == digest
        other = b'{"schemaVersion":2,"layers":["evil"]}'
        registry.manifests[("team/app", str(digest))] = (ACCEPT[0], other)
        with pytest.raises(IntegrityError):
            client.get_manifest("team/app", str(digest), ACCEPT)


def test_manifest_digest_header_must_match(registry: FakeRegistry) -> None:
    registry.wrong_digest_header = True
    with _client(registry.netloc) as client, pytest.raises(IntegrityError):
        client.get_manifest("team/app", "latest", ACCEPT)


def test_accept_header_is_sent(registry: FakeRegistry) -> None:
    with _client(registry.netloc) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
    assert registry.requests[-1].headers["Accept"] == ", ".join(ACCEPT)


def test_schema1_is_unsupported(registry: FakeRegistry) -> None:
    registry.add_manifest("old/image", "latest", b'{"schemaVersion":1,"fsLayers":[]}',
                          "application/vnd.docker.distribution.manifest.v1+prettyjws")
    registry.add_manifest("old/untyped", "latest", b'{"schemaVersion":1,"fsLayers":[]}',
                          "application/json")
    with _client(registry.netloc) as client:
        for repository in ("old/image", "old/untyped"):
            with pytest.raises(UnsupportedManifest, match="schema 1"):
                client.get_manifest(repository, "latest", ACCEPT)


def test_generic_content_type_falls_back_to_the_body(registry: FakeRegistry) -> None:
    index = b'{"schemaVersion":2,"manifests":[]}'
    registry.add_manifest("multi/arch", "latest", index, "application/json")
    with _client(registry.netloc) as client:
        fetched = client.get_manifest("multi/arch", "latest", ACCEPT)
    assert fetched.media_type == "application/vnd.oci.image.index.v1+json"


def test_manifest_size_is_capped(registry: FakeRegistry) -> None:
    registry.add_manifest("big/one", "latest", b" " * (MANIFEST_LIMIT + 1))
    with _client(registry.netloc) as client, pytest.raises(RegistryError, match="larger"):
        client.get_manifest("big/one", "latest", ACCEPT)


# -- retries -----------------------------------------------------------------------------


def test_429_honours_retry_after(registry: FakeRegistry) -> None:
    registry.fail_429 = 2
    registry.retry_after = "7"
    sleeps: list[float] = []
    with _client(registry.netloc, sleeps) as client:
        assert client.get_manifest("team/app", "latest", ACCEPT).data == MANIFEST
    assert sleeps == [7.0, 7.0]


def test_retry_after_is_capped(registry: FakeRegistry) -> None:
    registry.fail_429 = 1
    registry.retry_after = "3600"
    sleeps: list[float] = []
    with _client(registry.netloc, sleeps, backoff_max=12.0) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
    assert sleeps == [12.0]


def test_retry_after_http_date() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=42), usegmt=True)
    assert parse_retry_after(later, now) == 42.0
    assert parse_retry_after("5", now) == 5.0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after(None, now) is None


def test_429_gives_up_as_rate_limited(registry: FakeRegistry) -> None:
    registry.fail_429 = 10
    sleeps: list[float] = []
    with _client(registry.netloc, sleeps, max_retries=2) as client, \
            pytest.raises(RateLimited, match="TOOMANYREQUESTS") as caught:
        client.get_manifest("team/app", "latest", ACCEPT)
    assert "mirror" in (caught.value.hint or "")
    assert len(sleeps) == 2


def test_500_backs_off_exponentially_with_jitter(registry: FakeRegistry) -> None:
    registry.fail_500 = 4
    sleeps: list[float] = []
    with _client(registry.netloc, sleeps, backoff_base=1.0, backoff_max=5.0) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
    assert len(sleeps) == 4
    for attempt, delay in enumerate(sleeps):
        ceiling = min(5.0, 2.0 ** attempt)
        assert ceiling / 2 <= delay <= ceiling


def test_500_gives_up_as_unreachable(registry: FakeRegistry) -> None:
    registry.fail_500 = 10
    with _client(registry.netloc, max_retries=1) as client, \
            pytest.raises(RegistryUnreachable, match="500"):
        client.get_manifest("team/app", "latest", ACCEPT)
    assert registry.fail_500 == 8


# -- blobs -------------------------------------------------------------------------------


def test_blob_streams_in_chunks_with_progress(registry: FakeRegistry) -> None:
    digest = Digest.parse(registry.add_blob(BLOB))
    sink = MemorySink()
    seen: list[int] = []
    with _client(registry.netloc) as client:
        client.fetch_blob("team/app", digest, len(BLOB), sink, progress=seen.append)
    assert bytes(sink.data) == BLOB
    assert sum(seen) == len(BLOB)
    assert max(sink.chunk_sizes) <= 1 << 20
    assert registry.requests[-1].headers.get("Accept-Encoding") == "identity"


def test_resumes_on_dropped_connection(registry: FakeRegistry) -> None:
    digest = Digest.parse(registry.add_blob(BLOB))
    registry.drop_after = 1_000_000
    registry.drop_times = 2
    sink = MemorySink()
    with _client(registry.netloc) as client:
        client.fetch_blob("team/app", digest, len(BLOB), sink)
    assert bytes(sink.data) == BLOB
    assert sink.restarts == 0
    ranges = [r.headers.get("Range") for r in registry.requests if "/blobs/" in r.path]
    assert ranges == [None, "bytes=1000000-", "bytes=2000000-"]


def test_gives_up_after_max_retries_interruptions(registry: FakeRegistry) -> None:
    digest = Digest.parse(registry.add_blob(BLOB))
    registry.drop_after = 10
    registry.drop_times = 100
    with _client(registry.netloc, max_retries=3) as client, \
            pytest.raises(RegistryUnreachable, match="after 4 attempts"):
        client.fetch_blob("team/app", digest, len(BLOB), MemorySink())


def test_restarts_when_range_is_ignored(registry: FakeRegistry) -> None:
    digest = Digest.parse(registry.add_blob(BLOB))
    registry.drop_after = 500_000
    registry.drop_times = 1
    registry.ignore_range = True
    sink = MemorySink()
    with _client(registry.netloc) as client:
        client.fetch_blob("team/app", digest, len(BLOB), sink)
    assert bytes(sink.data) == BLOB
    assert sink.restarts == 1


def test_restarts_on_mismatched_resume_offset(registry: FakeRegistry) -> None:
    digest = Digest.parse(registry.add_blob(BLOB))
    registry.wrong_range_start = True
    sink = MemorySink(BLOB[:1000])
    with _client(registry.netloc) as client:
        client.fetch_blob("team/app", digest, len(BLOB), sink)
    assert bytes(sink.data) == BLOB
    assert sink.restarts == 1


def test_resumes_from_a_partial_sink(registry: FakeRegistry) -> None:
    digest = Digest.parse(registry.add_blob(BLOB))
    sink = MemorySink(BLOB[:123_456])
    with _client(registry.netloc) as client:
        client.fetch_blob("team/app", digest, len(BLOB), sink)
    assert bytes(sink.data) == BLOB
    assert registry.requests[-1].headers["Range"] == "bytes=123456-"


def test_complete_sink_is_done(registry: FakeRegistry) -> None:
    digest = Digest.parse(registry.add_blob(BLOB))
    with _client(registry.netloc) as client:
        client.fetch_blob("team/app", digest, len(BLOB), MemorySink(BLOB))
        assert registry.paths("/v2/team/app/blobs") == []
        sink = MemorySink(BLOB)  # size unknown: the registry's 416 says it is complete
        client.fetch_blob("team/app", digest, None, sink)
    assert bytes(sink.data) == BLOB
    assert sink.restarts == 0
    assert registry.paths("/v2/team/app/blobs") == [f"/v2/team/app/blobs/{digest}"]


def test_oversized_blob_is_refused(registry: FakeRegistry) -> None:
    digest = Digest.parse(registry.add_blob(BLOB))
    with _client(registry.netloc) as client, pytest.raises(IntegrityError, match="larger"):
        client.fetch_blob("team/app", digest, 1000, MemorySink())


def test_redirect_to_other_host_drops_authorization(registry: FakeRegistry,
                                                   storage: FakeRegistry) -> None:
    registry.auth = "bearer"
    digest = Digest.parse(registry.add_blob(BLOB))
    storage.blobs[str(digest)] = BLOB
    registry.redirect_blobs_to = storage.base_url
    storage.drop_after = 100_000
    storage.drop_times = 1
    sink = MemorySink()
    with _client(registry.netloc) as client:
        client.fetch_blob("team/app", digest, len(BLOB), sink)
    assert bytes(sink.data) == BLOB
    origin_blobs = [r for r in registry.requests if "/blobs/" in r.path]
    assert origin_blobs[-1].headers["Authorization"].startswith("Bearer ")
    assert len(storage.requests) == 2
    assert all("Authorization" not in r.headers for r in storage.requests)
    assert storage.requests[1].headers["Range"] == "bytes=100000-"


def test_layer_urls_after_404(registry: FakeRegistry, storage: FakeRegistry) -> None:
    registry.auth = "bearer"
    digest = _digest(b"foreign layer")
    storage.blobs[str(digest)] = b"foreign layer"
    urls = ["ftp://ignored.example/x", f"{storage.base_url}/v2/x/blobs/missing",
            f"{storage.base_url}/v2/x/blobs/{digest}"]
    sink = MemorySink()
    with _client(registry.netloc) as client:
        client.fetch_blob("team/app", digest, 13, sink, urls=urls)
    assert bytes(sink.data) == b"foreign layer"
    assert all("Authorization" not in r.headers for r in storage.requests)
    with _client(registry.netloc) as client, pytest.raises(NotFound):
        client.fetch_blob("team/app", digest, 13, MemorySink())


def test_parallel_blob_fetches_share_one_client(registry: FakeRegistry) -> None:
    registry.auth = "bearer"
    blobs = {Digest.parse(registry.add_blob(BLOB[i:] + bytes([i]))): BLOB[i:] + bytes([i])
             for i in range(6)}
    with _client(registry.netloc) as client, ThreadPoolExecutor(4) as pool:
        def fetch(digest: Digest) -> bytes:
            sink = MemorySink()
            client.fetch_blob("team/app", digest, len(blobs[digest]), sink)
            return bytes(sink.data)
        results = dict(zip(blobs, pool.map(fetch, blobs), strict=True))
    assert results == blobs


# -- mirrors -----------------------------------------------------------------------------


def test_mirror_is_tried_first(registry: FakeRegistry, storage: FakeRegistry) -> None:
    mirror = storage
    mirror.add_manifest("team/app", "latest", MANIFEST)
    with _client(registry.netloc, mirrors={registry.netloc: [mirror.base_url]}) as client:
        client.get_manifest("team/app", "latest", ACCEPT)
    assert mirror.paths("/v2/team") == ["/v2/team/app/manifests/latest"]
    assert registry.requests == []


def test_mirror_failures_fall_through(registry: FakeRegistry, storage: FakeRegistry) -> None:
    mirror = storage
    dead = f"http://127.0.0.1:{free_port()}"
    digest = Digest.parse(registry.add_blob(BLOB))
    mirrors = {registry.netloc: [dead, mirror.base_url]}
    with _client(registry.netloc, mirrors=mirrors) as client:
        # the dead mirror refuses, the live mirror has no such manifest: the origin serves it
        assert client.get_manifest("team/app", "latest", ACCEPT).data == MANIFEST
        mirror.fail_500 = 1
        sink = MemorySink()
        client.fetch_blob("team/app", digest, len(BLOB), sink)
    assert bytes(sink.data) == BLOB
    assert mirror.paths("/v2/team") == ["/v2/team/app/manifests/latest",
                                        f"/v2/team/app/blobs/{digest}"]


def test_mirror_with_its_own_auth(registry: FakeRegistry, storage: FakeRegistry) -> None:
    mirror = storage
    mirror.auth = "bearer"
    mirror.add_manifest("library/alpine", "latest", MANIFEST)
    with _client("docker.io", mirrors={"docker.io": [mirror.base_url]}) as client:
        assert client.get_manifest("library/alpine", "latest", ACCEPT).data == MANIFEST
    assert len(mirror.token_requests()) == 1
    assert mirror.paths("/v2/library") == ["/v2/library/alpine/manifests/latest"] * 2


def test_unreadable_auth_file_is_reported(tmp_path: Path, registry: FakeRegistry) -> None:
    registry.auth = "basic"
    broken = tmp_path / "auth.json"
    broken.write_text("[")
    config = RegistryConfig(credentials=CredentialStore([broken]))
    with RegistryClient(registry.netloc, config) as client, \
            pytest.raises(RegistryError, match=r"auth\.json"):
        client.get_manifest("team/app", "latest", ACCEPT)


def test_resumes_after_read_timeout(registry: FakeRegistry) -> None:
    digest = Digest.parse(registry.add_blob(BLOB))
    registry.stall_after = 300_000
    registry.stall_times = 1
    registry.stall_seconds = 3.0
    sink = MemorySink()
    with _client(registry.netloc, timeout=0.5) as client:
        client.fetch_blob("team/app", digest, len(BLOB), sink)
    assert bytes(sink.data) == BLOB
    ranges = [r.headers.get("Range") for r in registry.requests if "/blobs/" in r.path]
    assert ranges == [None, "bytes=300000-"]


def test_resumes_a_cut_chunked_body(registry: FakeRegistry) -> None:
    digest = Digest.parse(registry.add_blob(BLOB))
    registry.chunked = True
    registry.drop_after = 777_777
    registry.drop_times = 1
    sink = MemorySink()
    with _client(registry.netloc) as client:
        client.fetch_blob("team/app", digest, len(BLOB), sink)
        assert bytes(sink.data) == BLOB
        # size unknown and the body cut cleanly at a chunk boundary: still resumed
        registry.drop_times = 1
        unknown = MemorySink()
        client.fetch_blob("team/app", digest, None, unknown)
    assert bytes(unknown.data) == BLOB


# -- with the real store as the sink ------------------------------------------------------


def test_into_the_store_resuming_a_partial_left_by_a_failed_run(registry: FakeRegistry,
                                                                 tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    digest = Digest.parse(registry.add_blob(BLOB))
    registry.drop_after = 2_000_000
    registry.drop_times = 1
    with _client(registry.netloc, max_retries=0) as client, \
            store.ingest(digest, len(BLOB)) as ingest:
        assert ingest is not None
        with pytest.raises(RegistryUnreachable, match="gave up"):
            client.fetch_blob("team/app", digest, len(BLOB), ingest)
    with _client(registry.netloc) as client, store.ingest(digest, len(BLOB)) as ingest:
        assert ingest is not None and ingest.offset == 2_000_000
        client.fetch_blob("team/app", digest, len(BLOB), ingest)
        path = ingest.commit()
    assert path.read_bytes() == BLOB
    assert registry.requests[-1].headers["Range"] == "bytes=2000000-"


def test_corrupt_blob_is_refused_by_the_store(registry: FakeRegistry, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    digest = Digest.parse(registry.add_blob(BLOB))
    registry.corrupt = True
    with _client(registry.netloc) as client, store.ingest(digest, len(BLOB)) as ingest:
        assert ingest is not None
        client.fetch_blob("team/app", digest, len(BLOB), ingest)
        with pytest.raises(IntegrityError):
            ingest.commit()
    assert not store.has_blob(digest)


def test_retry_time_counts_from_the_last_progress(registry: FakeRegistry) -> None:
    """A download that keeps moving is resumed however long it has run; one that makes no
    progress for retry_time gives up."""
    now = [0.0]

    class SlowDisk(MemorySink):
        def write(self, chunk: bytes) -> None:
            super().write(chunk)
            now[0] += 1000.0  # each chunk takes long: the download runs for hours

    digest = registry.add_blob(BLOB)
    registry.drop_after = 1_000_000
    registry.drop_times = 2
    sink = SlowDisk()
    config = RegistryConfig(credentials=CredentialStore([]), retry_time=120)
    with RegistryClient(registry.netloc, config, sleep=lambda _: None,
                        clock=lambda: now[0]) as client:
        client.fetch_blob("team/app", _digest(BLOB), len(BLOB), sink)
    assert bytes(sink.data) == BLOB and digest == str(_digest(BLOB))
