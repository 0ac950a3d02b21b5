"""Pull policies: ``missing`` uses a complete cached copy without asking the source, ``never``
uses only the cache. The source is an OCI layout read through the real pull path; a provider
factory that fails proves that the source was not asked."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest

from ocistage.bundler.errors import SourceError
from ocistage.bundler.flows.bundle import make_bundle
from ocistage.bundler.image.platform import Platform
from ocistage.bundler.image.reference import ImageSource, parse_reference
from ocistage.bundler.pull import PullOptions, cached_image, pull
from ocistage.bundler.registry.client import RegistryConfig
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.bundler.settings import load_settings
from ocistage.bundler.sources import ImageProvider, open_provider
from ocistage.cache.gc import GcOptions, collect
from ocistage.cache.leases import InUse
from ocistage.cache.store import Store
from ocistage.errors import UsageError
from tests.bundler.tarbuilder import build_tar, file, write_oci_layout

AMD64 = Platform("linux", "amd64")
LAYERS = [build_tar([file("etc/hello", b"hello")]), build_tar([file("etc/more", b"more")])]


class Asked(AssertionError):
    pass


def never_asked(source: ImageSource, config: RegistryConfig) -> ImageProvider:
    raise Asked(f"the source {source} was asked")


def counting(calls: list[str]):  # type: ignore[no-untyped-def]
    def factory(source: ImageSource, config: RegistryConfig) -> ImageProvider:
        calls.append(str(source))
        return open_provider(source, config)
    return factory


@pytest.fixture
def source(tmp_path: Path) -> ImageSource:
    path = tmp_path / "layout"
    write_oci_layout(path, LAYERS, tag="t", kind="gzip")
    return parse_reference(f"oci:{path}:t")


def options(policy: str) -> PullOptions:
    return PullOptions(platform=AMD64, policy=policy)


def test_missing_uses_the_cached_copy_without_asking_the_source(
        tmp_path: Path, source: ImageSource) -> None:
    store = Store.open(tmp_path / "cache")
    first = pull(source, store, options("always"))
    recorded = store.lookup(first.name)
    again = pull(source, store, options("missing"), provider_factory=never_asked)
    assert again.manifest.digest == first.manifest.digest
    assert again.fetched_bytes == 0 and again.reused_blobs == 1 + len(LAYERS)
    assert store.lookup(first.name) == recorded  # the record (when it was resolved) is kept
    never = pull(source, store, options("never"), provider_factory=never_asked)
    assert never.manifest.digest == first.manifest.digest


def test_a_bundle_with_missing_needs_no_source(tmp_path: Path, source: ImageSource) -> None:
    store = Store.open(tmp_path / "cache")
    pull(source, store, options("always"))
    shutil.rmtree(tmp_path / "layout")  # the source is gone (a node without the registry)
    result = make_bundle(source, store, tmp_path / "bundle", pull_options=options("missing"),
                         config_options=ConfigOptions(args=["/bin/true"]))
    assert (result.path / "rootfs" / "etc" / "hello").read_bytes() == b"hello"
    assert (result.path / "rootfs" / "etc" / "more").read_bytes() == b"more"


def test_missing_asks_the_source_when_the_cache_lacks_a_blob(
        tmp_path: Path, source: ImageSource) -> None:
    store = Store.open(tmp_path / "cache")
    first = pull(source, store, options("always"))
    store.blob_path(first.layers[1].digest).unlink()  # e.g. removed by a GC
    assert cached_image(source, store, AMD64) is None
    calls: list[str] = []
    again = pull(source, store, options("missing"), provider_factory=counting(calls))
    assert calls == [str(source)]
    assert again.fetched_bytes == first.layers[1].size
    with pytest.raises(SourceError, match="not in the cache"):
        store.blob_path(first.layers[0].digest).unlink()
        pull(source, store, options("never"), provider_factory=never_asked)


def gc_before_the_lease(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run a real ``cache gc`` of everything unprotected (another member's) just before the
    pull's lease is written: the order in which a GC that read the leases first sees it."""
    real = InUse.protect

    def protect(self: InUse, targets: Iterable[str]) -> None:
        if not self.targets:
            collect(store, GcOptions(max_size=0))
        real(self, targets)

    monkeypatch.setattr(InUse, "protect", protect)


@pytest.mark.parametrize("with_bundle", [False, True])
def test_a_cached_copy_that_a_gc_takes_before_the_lease_is_pulled_again(
        tmp_path: Path, source: ImageSource, monkeypatch: pytest.MonkeyPatch,
        with_bundle: bool) -> None:
    """The endurance test's failure: a get found the image complete in a group cache, a gc
    removed it before the get's lease counted, and the get failed with 'blob ... is missing'
    instead of fetching it again."""
    store = Store.open(tmp_path / "cache")
    first = pull(source, store, options("always"))
    assert cached_image(source, store, AMD64) is not None
    gc_before_the_lease(store, monkeypatch)
    calls: list[str] = []
    if with_bundle:
        result = make_bundle(source, store, tmp_path / "bundle",
                             pull_options=options("missing"),
                             config_options=ConfigOptions(args=["/bin/true"]))
        assert (result.path / "rootfs" / "etc" / "more").read_bytes() == b"more"
        assert result.image.manifest.digest == first.manifest.digest
    else:
        again = pull(source, store, options("missing"), provider_factory=counting(calls))
        assert again.manifest.digest == first.manifest.digest
        assert again.fetched_bytes > sum(layer.size for layer in first.layers)
        assert calls == [str(source)]
    assert cached_image(source, store, AMD64) is not None


def test_never_says_a_gc_took_the_cached_copy(tmp_path: Path, source: ImageSource,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(tmp_path / "cache")
    pull(source, store, options("always"))
    gc_before_the_lease(store, monkeypatch)
    with pytest.raises(SourceError, match="a `cache gc` removed it"):
        pull(source, store, options("never"), provider_factory=never_asked)


def test_another_platform_in_the_cache_is_not_used(tmp_path: Path, source: ImageSource) -> None:
    store = Store.open(tmp_path / "cache")
    pull(source, store, options("always"))
    arm = Platform("linux", "arm64", "v8")
    assert cached_image(source, store, arm) is None
    with pytest.raises(SourceError) as raised:
        pull(source, store, PullOptions(platform=arm, policy="never"),
             provider_factory=never_asked)
    assert "--pull missing" in (raised.value.hint or "")


def test_never_with_an_empty_cache_fails_with_a_hint(tmp_path: Path,
                                                      source: ImageSource) -> None:
    with pytest.raises(SourceError) as raised:
        pull(source, Store.open(tmp_path / "cache"), options("never"),
             provider_factory=never_asked)
    assert "pull it first" in (raised.value.hint or "")


def test_the_policy_comes_from_option_environment_or_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setenv("OCISTAGE_CONFIG", str(config))
    monkeypatch.delenv("OCISTAGE_PULL", raising=False)
    assert load_settings(cache=tmp_path).pull == "always"
    config.write_text('pull = "missing"\n')
    assert load_settings(cache=tmp_path).pull == "missing"
    monkeypatch.setenv("OCISTAGE_PULL", "never")
    assert load_settings(cache=tmp_path).pull == "never"
    assert load_settings(cache=tmp_path, pull="always").pull == "always"
    with pytest.raises(UsageError, match="invalid pull policy"):
        load_settings(cache=tmp_path, pull="sometimes")
