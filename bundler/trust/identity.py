"""Docker references as containers/image reads them, and the ``signedIdentity`` matches.

:func:`parse_docker_name` is ``reference.ParseNormalizedNamed``: ``busybox`` is
``docker.io/library/busybox``, no default tag is added (a name alone stays name-only).
:func:`identity_matches` is each ``signedIdentity``'s ``matchesDockerReference``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ocistage.bundler.image.errors import InvalidReference
from ocistage.bundler.image.reference import parse_registry_reference
from ocistage.cache.digest import Digest

if TYPE_CHECKING:
    from ocistage.bundler.trust.policy import SignedIdentity

#: a docker reference is short; a signature's longer one is no reference
REFERENCE_LIMIT = 4096


@dataclass(frozen=True)
class DockerName:
    """A normalised docker reference: ``name`` (host/path), and a tag and/or digest."""

    name: str
    tag: str | None
    digest: Digest | None

    @property
    def name_only(self) -> bool:
        return self.tag is None and self.digest is None

    @property
    def domain(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def path(self) -> str:
        return self.name.split("/", 1)[1]

    def __str__(self) -> str:
        text = self.name
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text


def parse_docker_name(text: str) -> DockerName | None:
    """``text`` normalised as ``reference.ParseNormalizedNamed`` does, or None if invalid."""
    if len(text) > REFERENCE_LIMIT or text.startswith("docker://") or text != text.strip():
        return None
    body = text.split("@", 1)[0]
    tagged = body.rfind(":") > body.rfind("/")
    try:
        parsed = parse_registry_reference(text)
    except (InvalidReference, ValueError):
        return None
    tag = parsed.tag if tagged else None
    return DockerName(parsed.name, tag, parsed.digest)


def _match_exact(intended: DockerName, signed: DockerName) -> bool:
    if intended.name_only or signed.name_only:
        return False
    return str(signed) == str(intended)


def _match_repo_digest_or_exact(intended: DockerName, signed: DockerName) -> bool:
    # containers/image switches on the reference's kind: a tagged one is matched exactly,
    # a digested one by repository (a docker transport reference is never both)
    if intended.tag is not None:
        return str(signed) == str(intended)
    if intended.digest is not None:
        return signed.name == intended.name
    return False


def ref_matches_prefix(ref: str, prefix: str) -> bool:
    """containers/image's ``refMatchesPrefix``: ``prefix`` is the whole ``ref`` or is
    followed in it by ``:``, ``/`` or ``@``."""
    if len(ref) < len(prefix):
        return False
    if len(ref) == len(prefix):
        return ref == prefix
    return ref.startswith(prefix) and ref[len(prefix)] in ":/@"


def identity_matches(identity: SignedIdentity, intended: DockerName | None,
                     signature_reference: str) -> bool:
    """Whether a signature claiming ``signature_reference`` is acceptable for an image known
    as ``intended`` (None: the image has no docker reference, as ``oci:`` images)."""
    signed = parse_docker_name(signature_reference)
    if signed is None:
        return False
    kind = identity.type
    if kind == "exactReference":
        assert identity.reference is not None
        return _match_exact(identity.reference, signed)
    if kind == "exactRepository":
        assert identity.repository is not None
        return signed.name == identity.repository.name
    if intended is None:
        return False
    if kind == "matchExact":
        return _match_exact(intended, signed)
    if kind == "matchRepository":
        return signed.name == intended.name
    if kind == "remapIdentity":
        if ref_matches_prefix(str(intended), identity.prefix):
            text = identity.signed_prefix + str(intended)[len(identity.prefix):]
            remapped = parse_docker_name(text)
            if remapped is None or str(remapped) != text:  # reference.ParseNamed: canonical
                return False
            intended = remapped
        return _match_repo_digest_or_exact(intended, signed)
    return _match_repo_digest_or_exact(intended, signed)
