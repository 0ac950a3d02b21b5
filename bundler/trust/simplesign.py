"""The payload of a "simple signing" signature (the atomic container signature), read as
strictly as containers/image reads it.

``critical`` and ``optional`` and nothing else,
``critical`` exactly ``type``, ``image`` (``docker-manifest-digest``) and ``identity``
(``docker-reference``), no key twice."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ocistage.bundler.trust.errors import SignatureRejected
from ocistage.cache.jsondoc import DuplicateKey, unique_keys

SIGNATURE_TYPE = "atomic container signature"


@dataclass(frozen=True)
class SignedClaim:
    manifest_digest: str
    docker_reference: str


def _exact(value: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != set(keys):
        raise SignatureRejected(f"the signature's {where} must hold exactly "
                                f"{', '.join(keys)}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise SignatureRejected(f"the signature's {where} is not a string")
    return value


def parse_payload(payload: bytes) -> SignedClaim:
    try:
        document = json.loads(payload.decode("utf-8"), object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        raise SignatureRejected(f"the signature repeats the key {exc.key!r}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise SignatureRejected("the signed payload is not JSON") from None
    body = _exact(document, "top level", ("critical", "optional"))
    optional = body["optional"]
    if not isinstance(optional, dict):
        raise SignatureRejected("the signature's optional part is not an object")
    if "creator" in optional:
        _text(optional["creator"], "optional.creator")
    if "timestamp" in optional:
        stamp = optional["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, int | float) or int(stamp) != stamp:
            raise SignatureRejected("the signature's optional.timestamp is not an integer")
    critical = _exact(body["critical"], "critical part", ("type", "image", "identity"))
    if critical["type"] != SIGNATURE_TYPE:
        raise SignatureRejected(f"unrecognised signature type {critical['type']!r}")
    image = _exact(critical["image"], "critical.image", ("docker-manifest-digest",))
    identity = _exact(critical["identity"], "critical.identity", ("docker-reference",))
    return SignedClaim(_text(image["docker-manifest-digest"], "docker-manifest-digest"),
                       _text(identity["docker-reference"], "docker-reference"))
