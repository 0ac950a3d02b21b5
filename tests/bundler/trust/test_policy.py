"""containers-policy.json(5) parsing as containers/image 5.23 parses it: what loads, and what
is refused with one error naming the file and the problem."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ocistage.bundler.trust.errors import PolicyError
from ocistage.bundler.trust.policy import parse_policy, read_policy

ACCEPT = {"type": "insecureAcceptAnything"}


def load(document: object) -> object:
    return parse_policy(json.dumps(document).encode(), Path("/p.json"))


def test_a_full_policy_loads() -> None:
    policy = load({
        "default": [{"type": "reject"}],
        "transports": {
            "docker": {
                "reg.example/ns": [{"type": "signedBy", "keyType": "GPGKeys",
                                    "keyPath": "/k.gpg"}],
                "reg.example/x": [{"type": "signedBy", "keyType": "GPGKeys",
                                   "keyPaths": ["/a", "/b"],
                                   "signedIdentity": {"type": "remapIdentity",
                                                      "prefix": "reg.example",
                                                      "signedPrefix": "other.example:5000/m"}}],
                "reg.example/y": [{"type": "signedBy", "keyType": "GPGKeys",
                                   "keyData": base64.b64encode(b"key").decode(),
                                   "signedIdentity": {"type": "exactReference",
                                                      "dockerReference": "a/b:c"}}],
                "*.example": [ACCEPT],
                "": [ACCEPT],
            },
            "oci": {"/srv/images": [{"type": "reject"}]},
            "atomic": {"whatever": [ACCEPT]},
        },
    })
    assert policy.default[0].type == "reject"  # type: ignore[attr-defined]
    scopes = policy.transports["docker"]  # type: ignore[attr-defined]
    assert scopes["reg.example/x"][0].key_paths == ("/a", "/b")
    assert scopes["reg.example/y"][0].key_data == b"key"
    assert str(scopes["reg.example/y"][0].identity.reference) == "docker.io/a/b:c"
    # a docker-daemon scope that only looks like algo:value is a namespace like any other
    load({"default": [ACCEPT], "transports": {"docker-daemon": {"localhost:5000": [ACCEPT]}}})


@pytest.mark.parametrize(("document", "problem"), [
    ({}, '"default" is missing'),
    ({"default": []}, "must not be empty"),
    ({"default": [ACCEPT], "extra": 1}, "unknown key 'extra'"),
    ({"default": [{"type": "acceptEverything"}]}, "unknown requirement type"),
    ({"default": [{"type": "reject", "keyPath": "/k"}]}, "unknown key 'keyPath'"),
    ({"default": [{"type": "signedBy", "keyPath": "/k"}]}, "needs \"keyType\""),
    ({"default": [{"type": "signedBy", "keyType": "GPGKeys"}]}, "exactly one of"),
    ({"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k",
                   "keyData": "AA=="}]}, "exactly one of"),
    ({"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPaths": []}]},
     "non-empty list"),
    ({"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyData": "%%%"}]},
     "not valid base64"),
    ({"default": [{"type": "signedBy", "keyType": "PGP", "keyPath": "/k"}]},
     "keyType 'PGP' is unknown"),
    ({"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k",
                   "signedIdentity": {"type": "matchAnything"}}]}, "unknown type"),
    ({"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k",
                   "signedIdentity": {"type": "exactReference",
                                      "dockerReference": "a/b"}}]},
     "neither a tag nor a digest"),
    ({"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k",
                   "signedIdentity": {"type": "remapIdentity", "prefix": "Bad Prefix",
                                      "signedPrefix": "x.example"}}]}, "not a valid prefix"),
    ({"default": [ACCEPT], "transports": {"oci": {"relative/dir": [ACCEPT]}}},
     "absolute path"),
    ({"default": [ACCEPT], "transports": {"oci": {"/": [ACCEPT]}}}, 'scope "/"'),
    ({"default": [ACCEPT], "transports": {"oci": {"/a/../b": [ACCEPT]}}}, "canonical"),
    ({"default": [ACCEPT], "transports": {"docker": {"x": {}}}}, "list of requirements"),
    ({"default": [ACCEPT], "transports": {"docker-archive": {"/a.tar": [ACCEPT]}}},
     'except the default ""'),
    ({"default": [ACCEPT], "transports": {"docker-daemon": {"sha256:" + "a" * 64: [ACCEPT]}}},
     "algo:digest"),
])
def test_an_invalid_policy_is_one_error_naming_the_file(document: object, problem: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load(document)
    assert caught.value.message.startswith("invalid policy in /p.json: ")
    assert problem in caught.value.message
    assert caught.value.hint


def test_a_repeated_key_is_refused() -> None:
    with pytest.raises(PolicyError, match="duplicate key 'default'"):
        parse_policy(b'{"default": [{"type": "reject"}], "default": []}', Path("/p"))


@given(st.binary(max_size=200))
def test_any_bytes_load_or_fail_cleanly(data: bytes) -> None:
    try:
        parse_policy(data, Path("/p"))
    except PolicyError as exc:
        assert exc.message.startswith("invalid policy in /p: ")


def test_deep_nesting_fails_cleanly() -> None:
    with pytest.raises(PolicyError):
        parse_policy(b"[" * 100000 + b"]" * 100000, Path("/p"))


def test_a_fifo_or_a_huge_file_is_no_policy(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(PolicyError, match="not a regular file"):
        read_policy(fifo)  # never waits for a writer
    huge = tmp_path / "huge"
    with huge.open("wb") as stream:
        stream.truncate(64 << 20)
    with pytest.raises(PolicyError, match="larger than"):
        read_policy(huge)
    with pytest.raises(PolicyError, match="No such file"):
        read_policy(tmp_path / "missing")
