"""Which scope applies (most specific wins), and the signedIdentity matches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.trust.identity import identity_matches, parse_docker_name
from ocistage.bundler.trust.policy import SignedIdentity, parse_identity, parse_policy
from ocistage.bundler.trust.scopes import docker_namespaces, image_identity, requirements_for

DIGEST = "sha256:" + "a" * 64


def test_namespaces_from_the_repository_up_to_the_host_then_wildcards() -> None:
    assert docker_namespaces("reg.example.com:5000/a/b/c") == (
        "reg.example.com:5000/a/b/c", "reg.example.com:5000/a/b", "reg.example.com:5000/a",
        "reg.example.com:5000", "*.example.com", "*.com")
    assert docker_namespaces("docker.io/library/busybox") == (
        "docker.io/library/busybox", "docker.io/library", "docker.io", "*.io")


SCOPES = ["reg.example.com:5000/a/b:t", "reg.example.com:5000/a/b", "reg.example.com:5000/a",
          "reg.example.com:5000", "*.example.com", "*.com", ""]


@given(st.sets(st.sampled_from(SCOPES)))
def test_the_most_specific_scope_wins(present: set[str]) -> None:
    document = {"default": [{"type": "reject"}],
                "transports": {"docker": {scope: [{"type": "insecureAcceptAnything"}]
                                          for scope in present}}}
    policy = parse_policy(json.dumps(document).encode(), Path("/p"))
    match = requirements_for(policy, image_identity(
        parse_reference("reg.example.com:5000/a/b:t")))
    expected = next((scope for scope in SCOPES if scope in present), None)
    if expected is None:
        assert match.transport is None
    else:
        assert (match.transport, match.scope) == ("docker", expected)


def test_a_digest_reference_is_its_own_identity() -> None:
    image = image_identity(parse_reference(f"reg.example/a@{DIGEST}"))
    assert image.identity == f"reg.example/a@{DIGEST}"


def test_oci_layouts_are_scoped_by_directory(tmp_path: Path) -> None:
    image = image_identity(parse_reference(f"oci:{tmp_path}/layout:v1"))
    # the tag is no part of the identity (containers/image: "DIR:name" and "DIR" may be one)
    assert image.identity == f"{tmp_path.resolve()}/layout"
    assert image.namespaces[0] == str(tmp_path.resolve())
    assert "/" not in image.namespaces
    assert image.docker is None


def name(text: str) -> object:
    return parse_docker_name(text)


@pytest.mark.parametrize(("identity", "intended", "signed", "ok"), [
    ({"type": "matchRepoDigestOrExact"}, "r.io/a:1", "r.io/a:1", True),
    ({"type": "matchRepoDigestOrExact"}, "r.io/a:1", "r.io/a:2", False),
    ({"type": "matchRepoDigestOrExact"}, f"r.io/a@{DIGEST}", "r.io/a:anything", True),
    ({"type": "matchRepoDigestOrExact"}, f"r.io/a@{DIGEST}", "r.io/b:1", False),
    ({"type": "matchExact"}, "r.io/a:1", "r.io/a:1", True),
    ({"type": "matchExact"}, "r.io/a:1", "r.io/a", False),
    ({"type": "matchExact"}, f"r.io/a@{DIGEST}", "r.io/a:1", False),
    ({"type": "matchRepository"}, "r.io/a:1", "r.io/a:2", True),
    ({"type": "matchRepository"}, "r.io/a:1", "r.io/b:1", False),
    ({"type": "exactReference", "dockerReference": "r.io/x:9"}, "r.io/a:1", "r.io/x:9", True),
    ({"type": "exactReference", "dockerReference": "r.io/x:9"}, "r.io/a:1", "r.io/a:1", False),
    ({"type": "exactRepository", "dockerRepository": "r.io/x"}, "r.io/a:1", "r.io/x:5", True),
    ({"type": "exactRepository", "dockerRepository": "r.io/x"}, "r.io/a:1", "r.io/a:1", False),
    ({"type": "remapIdentity", "prefix": "mirror.io/m", "signedPrefix": "r.io/n"},
     "mirror.io/m/a:1", "r.io/n/a:1", True),
    ({"type": "remapIdentity", "prefix": "mirror.io/m", "signedPrefix": "r.io/n"},
     "mirror.io/m/a:1", "mirror.io/m/a:1", False),
    ({"type": "remapIdentity", "prefix": "mirror.io/m", "signedPrefix": "r.io/n"},
     "mirror.io/mm/a:1", "mirror.io/mm/a:1", True),  # no prefix match: as the default
    ({"type": "matchRepoDigestOrExact"}, "docker.io/library/busybox:latest", "busybox:latest",
     True),
    ({"type": "matchRepoDigestOrExact"}, "r.io/a:1", "NOT A REFERENCE", False),
])
def test_signed_identities(identity: dict[str, str], intended: str, signed: str,
                           ok: bool) -> None:
    parsed: SignedIdentity = parse_identity(identity, "signedIdentity")
    assert identity_matches(parsed, parse_docker_name(intended), signed) is ok


@given(st.text(max_size=80))
def test_any_signature_identity_is_matched_or_refused_cleanly(text: str) -> None:
    for kind in ("matchExact", "matchRepoDigestOrExact", "matchRepository"):
        identity_matches(SignedIdentity(kind), parse_docker_name("r.io/a:1"), text)


def test_without_a_docker_reference_only_the_exact_identities_can_match() -> None:
    assert not identity_matches(SignedIdentity(), None, "r.io/a:1")
    exact = parse_identity({"type": "exactRepository", "dockerRepository": "r.io/a"}, "x")
    assert identity_matches(exact, None, "r.io/a:1")
