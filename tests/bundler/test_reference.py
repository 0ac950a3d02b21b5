"""Image reference parsing: the distribution/reference grammar, Docker's normalisation and the
skopeo-style local transports."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ocistage.bundler.image.errors import InvalidReference
from ocistage.bundler.image.reference import (
    DockerArchiveReference,
    OciArchiveReference,
    OciLayoutReference,
    RegistryReference,
    parse_reference,
    parse_registry_reference,
)
from ocistage.cache.digest import Digest
from ocistage.errors import UsageError

SHA = "sha256:" + "0123456789abcdef" * 4
SHA512 = "sha512:" + "ab" * 64
D = Digest.parse(SHA)


def reg(registry: str, repository: str, tag: str | None = "latest",
        digest: str | None = None) -> RegistryReference:
    return RegistryReference(registry, repository, tag,
                             Digest.parse(digest) if digest is not None else None)


VALID: list[tuple[str, RegistryReference]] = [
    ("alpine", reg("docker.io", "library/alpine")),
    ("alpine:3.19", reg("docker.io", "library/alpine", "3.19")),
    ("docker://alpine", reg("docker.io", "library/alpine")),
    ("docker://alpine:edge", reg("docker.io", "library/alpine", "edge")),
    ("library/alpine", reg("docker.io", "library/alpine")),
    ("docker.io/alpine", reg("docker.io", "library/alpine")),
    ("docker.io/library/alpine:latest", reg("docker.io", "library/alpine")),
    ("index.docker.io/alpine", reg("docker.io", "library/alpine")),
    ("index.docker.io/user/app:v1", reg("docker.io", "user/app", "v1")),
    ("user/app", reg("docker.io", "user/app")),
    ("user/team/app:1.0", reg("docker.io", "user/team/app", "1.0")),
    ("ghcr.io/org/team/app:v2", reg("ghcr.io", "org/team/app", "v2")),
    ("quay.io/app", reg("quay.io", "app")),
    ("localhost/app", reg("localhost", "app")),
    ("localhost:5000/app:dev", reg("localhost:5000", "app", "dev")),
    ("127.0.0.1:5000/a/b", reg("127.0.0.1:5000", "a/b")),
    ("[::1]:5000/app", reg("[::1]:5000", "app")),
    ("[fe80::1]/app:x", reg("[fe80::1]", "app", "x")),
    ("my-registry.example.com:443/x/y", reg("my-registry.example.com:443", "x/y")),
    ("Registry.Example.COM/app", reg("Registry.Example.COM", "app")),
    ("alpine@" + SHA, reg("docker.io", "library/alpine", None, SHA)),
    ("alpine:3.19@" + SHA, reg("docker.io", "library/alpine", "3.19", SHA)),
    ("ghcr.io/o/a@" + SHA512, reg("ghcr.io", "o/a", None, SHA512)),
    ("localhost:5000/app@" + SHA, reg("localhost:5000", "app", None, SHA)),
    ("org/a.b_c__d-e--f", reg("docker.io", "org/a.b_c__d-e--f")),
    ("app:UPPER_tag-1.2", reg("docker.io", "library/app", "UPPER_tag-1.2")),
    ("app:_leading_underscore", reg("docker.io", "library/app", "_leading_underscore")),
    ("app:" + "t" * 128, reg("docker.io", "library/app", "t" * 128)),
    ("docker:dind", reg("docker.io", "library/docker", "dind")),
    ("localhost:5000", reg("docker.io", "library/localhost", "5000")),
    ("x1/y2/z3", reg("docker.io", "x1/y2/z3")),
    ("registry:5000/app", reg("registry:5000", "app")),
    ("0/app", reg("docker.io", "0/app")),
]

INVALID: list[tuple[str, str]] = [
    ("", "empty"),
    ("docker://", "names no image"),
    ("alpine:", "no tag"),
    ("alpine@", "no digest"),
    ("alpine:3.19@", "no digest"),
    (" alpine", "whitespace"),
    ("alpine ", "whitespace"),
    ("alp ine", "whitespace"),
    ("alpine\n", "whitespace"),
    ("alpine\x00", "control character"),
    ("Alpine", "lowercase"),
    ("user/App", "lowercase"),
    ("ghcr.io/Org/app", "lowercase"),
    ("Foo/bar", "lowercase"),
    ("alpine@sha256:abc", "digest"),
    ("alpine@md5:" + "0" * 32, "digest"),
    ("alpine@sha256:" + "A" * 64, "digest"),
    ("alpine@" + SHA + "@" + SHA, "digest"),
    ("alpine:-tag", "invalid tag"),
    ("alpine:.tag", "invalid tag"),
    ("alpine:" + "t" * 129, "invalid tag"),
    ("alpine:ta+g", "invalid tag"),
    ("/alpine", "no such file or directory: /alpine"),  # a path, not a reference
    ("alpine/", "empty component"),
    ("a//b", "empty component"),
    ("ghcr.io/", "no repository"),
    ("ghcr.io/a/", "empty component"),
    ("-alpine", "invalid repository"),
    ("alpine-", "invalid repository"),
    ("a..b", "invalid repository"),
    ("a___b", "invalid repository"),
    ("a.-b", "invalid repository"),
    ("ex@mple.com/app", "digest"),
    ("-bad.example.com/app", "invalid registry"),
    ("a.b_c/g", "invalid registry"),  # a '.' makes the first component a registry
    ("bad-.example.com/app", "invalid registry"),
    ("example.com:port/app", "invalid registry"),
    ("127.0.0.1:99999/lib/app:1", "port 99999 is out of range"),
    ("example.com:0/app", "port 0 is out of range"),
    ("[::1]:65536/app", "port 65536 is out of range"),
    ("localhost:" + "9" * 5000 + "/app", "out of range"),
    ("[::1/app", "invalid registry"),
    ("[zz::1]:5000/app", "invalid registry"),
    ("0123456789abcdef" * 4, "image ID"),
    ("x.io/" + "a" * 251, "255"),
    ("ünïcode", "invalid repository"),
    ("app:täg", "invalid tag"),
    ("docker:///alpine", "empty component"),
    (":tag", "no image name"),
    ("@" + SHA, "no image name"),
]


@pytest.mark.parametrize(("text", "expected"), VALID, ids=[t for t, _ in VALID])
def test_valid_registry_references(text: str, expected: RegistryReference) -> None:
    assert parse_reference(text) == expected
    assert parse_registry_reference(text) == expected


@pytest.mark.parametrize(("text", "needle"), INVALID, ids=[repr(t)[:40] for t, _ in INVALID])
def test_invalid_references(text: str, needle: str) -> None:
    with pytest.raises(InvalidReference) as info:
        parse_reference(text)
    assert needle in info.value.message
    assert info.value.hint
    assert info.value.exit_code == 2


def test_table_is_large_enough() -> None:
    assert len(VALID) + len(INVALID) >= 40


def test_name_length_limit_counts_the_normalised_name() -> None:
    # 255 characters in all is allowed, 256 is not
    ok = "x.io/" + "a" * 250
    assert parse_reference(ok).repository == "a" * 250  # type: ignore[union-attr]
    with pytest.raises(InvalidReference, match="255"):
        parse_reference(ok + "a")
    # docker.io/library/ counts too
    with pytest.raises(InvalidReference, match="255"):
        parse_reference("a" * 240)


def test_canonical_forms() -> None:
    ref = parse_registry_reference("alpine")
    assert str(ref) == "docker.io/library/alpine:latest"
    assert ref.reference == "latest"
    assert ref.name == "docker.io/library/alpine"

    pinned = parse_registry_reference(f"alpine:3.19@{SHA}")
    assert str(pinned) == f"docker.io/library/alpine:3.19@{SHA}"
    assert pinned.reference == SHA  # the digest wins over the tag


def test_reference_requires_tag_or_digest() -> None:
    with pytest.raises(InvalidReference, match="neither a tag nor a digest"):
        RegistryReference("docker.io", "library/alpine", None, None)


def test_direct_construction_is_validated() -> None:
    with pytest.raises(InvalidReference):
        RegistryReference("ghcr.io", "../../etc", "latest", None)
    with pytest.raises(InvalidReference):
        RegistryReference("evil.io/x", "app", "latest", None)
    with pytest.raises(InvalidReference):
        RegistryReference("ghcr.io", "app", "bad tag", None)


def test_invalid_reference_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        parse_reference("UPPER")


def test_uppercase_hint_suggests_lowercase() -> None:
    with pytest.raises(InvalidReference) as info:
        parse_reference("ghcr.io/Org/App:v1")
    assert "'org/app'" in (info.value.hint or "")


# -- local transports (skopeo syntax: the path ends at the first ':') -----------------------

LOCAL: list[tuple[str, object]] = [
    ("oci:/srv/layout", OciLayoutReference(Path("/srv/layout"), None)),
    ("oci:layout", OciLayoutReference(Path("layout"), None)),
    ("oci:/srv/layout:v1", OciLayoutReference(Path("/srv/layout"), "v1")),
    ("oci:/srv/layout:docker.io/library/alpine:3.19",
     OciLayoutReference(Path("/srv/layout"), "docker.io/library/alpine:3.19")),
    ("oci:/srv/layout:My.Image", OciLayoutReference(Path("/srv/layout"), "My.Image")),
    ("oci-archive:/tmp/img.tar", OciArchiveReference(Path("/tmp/img.tar"), None)),
    ("oci-archive:/tmp/img.tar:latest", OciArchiveReference(Path("/tmp/img.tar"), "latest")),
    ("oci-archive:img.tar:a/b:c", OciArchiveReference(Path("img.tar"), "a/b:c")),
    ("docker-archive:/tmp/save.tar", DockerArchiveReference(Path("/tmp/save.tar"), None)),
    ("docker-archive:/tmp/save.tar:alpine",
     DockerArchiveReference(Path("/tmp/save.tar"), "docker.io/library/alpine:latest")),
    ("docker-archive:/tmp/save.tar:localhost:5000/app:v1",
     DockerArchiveReference(Path("/tmp/save.tar"), "localhost:5000/app:v1")),
]

LOCAL_INVALID: list[tuple[str, str]] = [
    ("oci:", "no path"),
    ("oci::tag", "no path"),
    ("oci:/srv/layout:", "no image name"),
    ("oci:/srv/layout:@0", "by index"),
    ("oci:/srv/layout:-bad", "invalid image name"),
    ("oci:/srv/layout:a//b", "invalid image name"),
    ("oci-archive:", "no path"),
    ("oci-archive:/tmp/x.tar:bad name", "whitespace"),
    ("docker-archive:", "no path"),
    ("docker-archive:/tmp/x.tar:", "no image name"),
    ("docker-archive:/tmp/x.tar:Alpine", "lowercase"),
    ("docker-archive:/tmp/x.tar:alpine@" + SHA, "by digest"),
    ("docker-archive:/tmp/x.tar:@1", "by index"),
]


@pytest.mark.parametrize(("text", "expected"), LOCAL, ids=[t for t, _ in LOCAL])
def test_local_references(text: str, expected: object) -> None:
    parsed = parse_reference(text)
    assert parsed == expected
    assert parse_reference(str(parsed)) == parsed


@pytest.mark.parametrize(("text", "needle"), LOCAL_INVALID, ids=[t for t, _ in LOCAL_INVALID])
def test_invalid_local_references(text: str, needle: str) -> None:
    with pytest.raises(InvalidReference) as info:
        parse_reference(text)
    assert needle in info.value.message


def test_transport_prefixes_are_not_registry_references() -> None:
    with pytest.raises(InvalidReference):
        parse_registry_reference("oci:/srv/layout")


# -- properties ----------------------------------------------------------------------------

_alnum = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=6)
_separator = st.sampled_from([".", "_", "__", "-", "--", "---"])
_component = st.builds(
    lambda first, rest: first + "".join(s + a for s, a in rest),
    _alnum, st.lists(st.tuples(_separator, _alnum), max_size=3))
_label = st.from_regex(r"\A[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,8}[a-zA-Z0-9])?\Z")
_port = st.integers(1, 65535).map(lambda p: f":{p}")
_domain_name = st.lists(_label, min_size=1, max_size=3).map(".".join)
_registry = st.one_of(
    st.builds(lambda labels, tld: f"{labels}.{tld}", _domain_name, _label),  # has a '.'
    st.builds(lambda name, port: name + port, _domain_name, _port),  # has a ':'
    st.just("localhost"),
    st.builds(lambda addr, port: f"[{addr}]{port}",
              st.from_regex(r"\A[0-9a-f]{0,4}(?::[0-9a-f]{0,4}){1,7}\Z").filter(bool),
              st.one_of(st.just(""), _port)),
).filter(lambda r: r != "index.docker.io")
_tag = st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}\Z")
_digest = st.one_of(
    st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda h: Digest("sha256", h)),
    st.text("0123456789abcdef", min_size=128, max_size=128).map(lambda h: Digest("sha512", h)),
)


@st.composite
def registry_references(draw: st.DrawFn) -> RegistryReference:
    registry = draw(st.one_of(_registry, st.just("docker.io")))
    components = draw(st.lists(_component, min_size=1, max_size=4))
    if registry == "docker.io" and len(components) == 1:
        components.insert(0, "library")
    tag = draw(st.one_of(st.none(), _tag))
    digest = draw(st.one_of(st.none(), _digest)) if tag is not None else draw(_digest)
    return RegistryReference(registry, "/".join(components), tag, digest)


@given(registry_references())
def test_round_trip_through_canonical_string(ref: RegistryReference) -> None:
    assert parse_reference(str(ref)) == ref
    assert parse_reference("docker://" + str(ref)) == ref


@given(st.from_regex(r"\A[a-z]{1,5}(?:\.[a-z]{1,3})?:[0-9]{1,7}/app\Z"))
@example("127.0.0.1:99999/app")
def test_a_registry_that_parses_has_a_port_a_url_can_carry(text: str) -> None:
    """Every registry the parser accepts is one the transport can address (a port out of
    range was an internal error there: issue 39)."""
    from urllib.parse import urlsplit

    try:
        parsed = parse_registry_reference(text)
    except InvalidReference as exc:
        assert exc.exit_code == 2
        return
    port = urlsplit(f"https://{parsed.registry}/").port
    assert port is None or 0 < port <= 65535


@given(st.text(max_size=80))
@example("docker://")
@example("oci:")
@example("a" * 300)
@example("[")
@example("a:b:c@d@e")
def test_random_text_only_ever_raises_invalid_reference(text: str) -> None:
    try:
        parsed = parse_reference(text)
    except InvalidReference:
        return
    assert parse_reference(str(parsed)) == parsed


@given(st.text(alphabet="abcAB01:/@.-_[]", max_size=40))
def test_grammar_like_text_only_ever_raises_invalid_reference(text: str) -> None:
    try:
        parsed = parse_reference(text)
    except InvalidReference:
        return
    assert parse_reference(str(parsed)) == parsed


@pytest.mark.parametrize("text", ["./mybundel", "../mybundel", "/nonexistent/dir", "~/nope",
                                  "~nosuchuser0/x", ".", ".."])
def test_paths_are_not_taken_for_references(text: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``./x`` once went to registry '.', ``/x/y`` gave "invalid repository name"."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(InvalidReference) as info:
        parse_reference(text)
    exists = (tmp_path / text).exists()
    assert info.value.message == (f"{text} is a directory, not an image reference" if exists
                                  else f"no such file or directory: {text}")
    assert "oci:PATH" in (info.value.hint or "")
