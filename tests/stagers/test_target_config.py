"""config.json rewriting when staged files are shared (read-only root) or privately copied."""

from __future__ import annotations

import json

from ocistage.cache.bundleinfo import SHARED_ROOT_ANNOTATION
from ocistage.stagers.target import readonly_config, writable_config


def config(readonly: bool, **annotations: str) -> bytes:
    return json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs", "readonly": readonly},
                       "annotations": annotations}).encode()


def test_sharing_makes_the_root_read_only_and_says_why() -> None:
    shared = readonly_config(config(False))
    assert shared is not None
    doc = json.loads(shared)
    assert doc["root"]["readonly"] is True
    assert doc["annotations"][SHARED_ROOT_ANNOTATION] == "true"


def test_a_root_read_only_by_request_stays_so_in_a_private_copy() -> None:
    shared = readonly_config(config(True))
    assert shared is not None
    assert SHARED_ROOT_ANNOTATION not in json.loads(shared)["annotations"]
    assert writable_config(shared) is None  # nothing to undo: the user asked for it


def test_a_private_copy_of_a_shared_bundle_is_writable_again() -> None:
    private = writable_config(config(True, **{SHARED_ROOT_ANNOTATION: "true", "a": "b"}))
    assert private is not None
    doc = json.loads(private)
    assert doc["root"]["readonly"] is False
    assert doc["annotations"] == {"a": "b"}


def test_not_a_runtime_config_is_left_alone() -> None:
    assert readonly_config(b"not json") is None
    assert writable_config(b'{"no": "root"}') is None
