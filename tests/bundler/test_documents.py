"""Hostile JSON documents: nested deeper than the parser recurses, or too large to read whole.

Each reaches a typed error (never RecursionError, never a 4 GiB read): an error body, a
manifest and a token reply from a real in-process registry, an ``oci:`` layout's index.json and
the cache's own index.json.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.bundler.errors import SourceError
from ocistage.bundler.image.errors import SchemaError
from ocistage.bundler.image.manifest import parse_manifest
from ocistage.bundler.registry.client import RegistryClient, RegistryConfig
from ocistage.bundler.registry.credentials import CredentialStore
from ocistage.bundler.registry.errors import AuthenticationError
from ocistage.bundler.sources import OciLayoutProvider
from ocistage.cache.errors import StoreError
from ocistage.cache.jsondoc import MAX_DEPTH, check_depth, parse_json
from ocistage.cache.store import Store
from ocistage.errors import NotFound
from tests.bundler.fakeregistry import FakeRegistry, serve

ACCEPT = ["application/vnd.oci.image.manifest.v1+json"]
DEEP = b"[" * 30_000 + b"]" * 30_000  # RecursionError in json.loads; under 64 KiB
SHALLOWER = b'{"a":' * 500 + b"1" + b"}" * 500   # parses, but nests 500 levels


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    with serve() as state:
        yield state


def _client(registry: FakeRegistry) -> RegistryClient:
    return RegistryClient(registry.netloc, RegistryConfig(credentials=CredentialStore([])),
                          sleep=lambda _: None)


@pytest.mark.parametrize("data", [DEEP, SHALLOWER])
def test_parse_json_bounds_nesting(data: bytes) -> None:
    with pytest.raises(ValueError, match="nested"):
        parse_json(data)


def test_parse_json_accepts_real_documents() -> None:
    value = {"a": [{"b": [1, 2, {"c": "d"}]}]}
    assert parse_json(json.dumps(value)) == value
    nested: object = 1
    for _ in range(MAX_DEPTH - 1):
        nested = [nested]
    check_depth([nested])
    with pytest.raises(ValueError):
        check_depth([[nested]])


@pytest.mark.parametrize("body", [DEEP, SHALLOWER])
def test_a_deep_error_body_is_still_a_typed_error(registry: FakeRegistry, body: bytes) -> None:
    registry.error_body = body
    with _client(registry) as client, pytest.raises(NotFound, match="HTTP 404"):
        client.get_manifest("team/app", "missing", ACCEPT)


def test_a_deep_manifest_is_a_schema_error(registry: FakeRegistry) -> None:
    registry.add_manifest("team/app", "deep", DEEP)
    registry.content_type = "application/json"  # the client looks inside for the media type
    with _client(registry) as client:
        fetched = client.get_manifest("team/app", "deep", ACCEPT)
    with pytest.raises(SchemaError):
        parse_manifest(fetched.data, fetched.media_type)


@pytest.mark.parametrize("body", [DEEP, SHALLOWER])
def test_a_deep_token_reply_is_an_authentication_error(registry: FakeRegistry,
                                                       body: bytes) -> None:
    registry.add_manifest("team/app", "latest", b"{}")
    registry.auth = "bearer"
    registry.token_body = body
    with _client(registry) as client, pytest.raises(AuthenticationError, match="unusable"):
        client.get_manifest("team/app", "latest", ACCEPT)


def _layout(path: Path) -> Path:
    path.mkdir()
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return path


def test_a_deep_layout_index_is_a_source_error(tmp_path: Path) -> None:
    layout = _layout(tmp_path / "layout")
    (layout / "index.json").write_bytes(DEEP)
    with pytest.raises(SourceError):
        OciLayoutProvider(layout, None).resolve()


def test_a_huge_layout_index_is_refused_unread(tmp_path: Path) -> None:
    layout = _layout(tmp_path / "layout")
    with open(layout / "index.json", "wb") as file:
        file.truncate(4 << 30)  # 4 GiB, sparse: a read of it whole would take minutes
    with pytest.raises(SourceError, match="larger than 4 MiB"):
        OciLayoutProvider(layout, None).resolve()


def test_a_huge_or_linked_cache_index_is_a_store_error(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    index = store.root / "index.json"
    os.unlink(index)
    with open(index, "wb") as file:
        file.truncate(4 << 30)
    with pytest.raises(StoreError, match="larger than"):
        store.read_index()
    os.unlink(index)
    (tmp_path / "elsewhere.json").write_text('{"manifests": []}')
    index.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(StoreError):
        store.read_index()
