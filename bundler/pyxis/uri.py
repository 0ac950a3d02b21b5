"""Parse an image named the way enroot and pyxis name it:
``[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ocistage.bundler.image.errors import InvalidReference
from ocistage.bundler.image.reference import (
    DEFAULT_REGISTRY,
    OFFICIAL_REPOSITORY_PREFIX,
    RegistryReference,
    parse_registry_reference,
)
from ocistage.bundler.registry.credentials import DOCKER_HUB_ALIASES

_ENROOT_PREFIX = "docker://"
_DIGEST_START = "sha256:"
_USER_RE = re.compile(r"[A-Za-z0-9_.!~*'()%;:&=+$,\-]+")


@dataclass(frozen=True)
class EnrootUri:
    """An image named the way enroot and pyxis name it; ``user`` picks the credentials."""

    user: str | None
    reference: RegistryReference


def parse_enroot_uri(text: str) -> EnrootUri:
    """Parse ``docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]`` (the ``docker://`` is optional).

    ``REGISTRY#IMAGE`` names the registry literally (``nvcr.io#nvidia/pytorch:24.01``); without
    ``#``, Docker's rules apply (``nvcr.io/nvidia/pytorch``, ``ubuntu`` on docker.io). A user
    is what comes before an ``@`` that does not start the digest.
    """
    body = text.removeprefix(_ENROOT_PREFIX)
    if not body:
        raise InvalidReference(f"{text!r} names no image",
                               "pyxis passes docker://[USER@][REGISTRY#]IMAGE[:TAG]")
    user, body = _split_user(body, text)
    if "#" not in body:
        return EnrootUri(user, parse_registry_reference(body))
    registry, _, image = body.partition("#")
    if not registry or not image or "#" in image or "/" in registry:
        raise InvalidReference(f"{text!r} is not REGISTRY#IMAGE[:TAG]",
                               "write the registry before '#' and the image after it, e.g. "
                               "nvcr.io#nvidia/pytorch:24.01-py3")
    parsed = parse_registry_reference(f"localhost/{image}", shown=text)  # errors name the URI
    repository = parsed.repository
    if registry in DOCKER_HUB_ALIASES:
        registry = DEFAULT_REGISTRY
        if "/" not in repository:
            repository = OFFICIAL_REPOSITORY_PREFIX + repository
    try:
        return EnrootUri(user, RegistryReference(registry, repository, parsed.tag,
                                                 parsed.digest))
    except InvalidReference as exc:  # the registry before '#' (a port out of range, ...)
        raise InvalidReference(f"{text!r}: {exc.message}", exc.hint) from exc


def _split_user(body: str, text: str) -> tuple[str | None, str]:
    at = body.find("@")
    if at < 0 or body.startswith(_DIGEST_START, at + 1):
        return None, body
    hash_at = body.find("#")
    if hash_at >= 0 and hash_at < at:
        return None, body  # REGISTRY#IMAGE@sha256:... is checked by the reference parser
    user = body[:at]
    if not _USER_RE.fullmatch(user):
        raise InvalidReference(f"{text!r} has an invalid user name {user!r}",
                               "write docker://USER@REGISTRY#IMAGE:TAG")
    return user, body[at + 1:]
