"""The verdict on one image: containers/image's ``IsRunningImageAllowed``.

The requirements of the scope that matches (:mod:`ocistage.bundler.trust.scopes`) must all
hold. ``signedBy`` holds when one of the image's signatures is accepted: verified by one of
the requirement's primary keys (:mod:`ocistage.bundler.trust.gpg`), claiming the image's
manifest digest and an identity the requirement's ``signedIdentity`` accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ocistage.bundler.trust.boundedread import BoundedReadError, read_regular
from ocistage.bundler.trust.errors import ImageRejected, SignatureRejected
from ocistage.bundler.trust.identity import identity_matches
from ocistage.bundler.trust.policy import Policy, Requirement
from ocistage.bundler.trust.scopes import ImageIdentity, ScopeMatch, requirements_for
from ocistage.cache.digest import Digest

if TYPE_CHECKING:
    from ocistage.bundler.trust.gpg import ThrowawayKeyring

# The signature machinery (gpg, the lookaside store, simple signing's payload) is imported by
# the signedBy requirement that needs it: under a policy that asks for no signature (the
# insecureAcceptAnything default) a warm bundle never loads it
# (tests/bundler/test_cli_imports.py).

KEY_FILE_LIMIT = 1 << 20

SIGSTORE_REASON = ("sigstoreSigned is not supported: Debian builds containers/image with "
                   "sigstore disabled, so skopeo and podman reject every image under it too, "
                   "and ocistage has no independent implementation to check against")


@dataclass(frozen=True)
class Verdict:
    """Whether the policy allows the image, the scope that decided and the requirement that
    failed (or the ``signedBy`` that was met, with its key's fingerprint)."""

    accepted: bool
    reference: str
    policy: str
    scope: ScopeMatch
    requirement: Requirement | None = None
    fingerprint: str | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "policy": self.policy,
            "scope": self.scope.describe(),
            "requirement": self.requirement.describe() if self.requirement else None,
            "fingerprint": self.fingerprint,
            "reason": self.reason or None,
        }

    def error(self) -> ImageRejected:
        requirement = self.requirement.describe() if self.requirement else "?"
        return ImageRejected(
            f"{self.reference} is rejected by the policy {self.policy}: scope "
            f"{self.scope.describe()}, requirement {requirement}: {self.reason}",
            verdict=self)


#: the image's signatures (raises LookasideError when the store cannot be read)
SignatureSource = Callable[[], list[bytes]]


def _keys(requirement: Requirement) -> bytes:
    if requirement.key_data is not None:
        return requirement.key_data
    data = b""
    for path in requirement.key_paths:
        try:
            data += read_regular(path, KEY_FILE_LIMIT)
        except BoundedReadError as exc:
            raise SignatureRejected(f"cannot read the key file {path}: {exc}") from None
    return data


def _accepts(ring: ThrowawayKeyring, requirement: Requirement, image: ImageIdentity,
             digest: Digest, signature: bytes) -> str:
    """The signer's fingerprint if ``signature`` meets ``requirement``, else raises."""
    from ocistage.bundler.trust.simplesign import parse_payload

    verified = ring.verify(signature)
    if verified.fingerprint != verified.primary:
        # containers/image 5.23 accepts the primary keys it imported, not their subkeys
        raise SignatureRejected(f"signature by key {verified.fingerprint} is not accepted "
                                f"(a subkey of {verified.primary}; skopeo accepts signatures "
                                "by the primary key only)")
    claim = parse_payload(verified.payload)
    if claim.manifest_digest != str(digest):
        raise SignatureRejected(f"the signature is for the manifest {claim.manifest_digest}, "
                                f"not {digest}")
    if not identity_matches(requirement.identity, image.docker, claim.docker_reference):
        raise SignatureRejected(f"the signature's identity {claim.docker_reference} is not "
                                f"accepted ({requirement.identity.describe()})")
    return verified.fingerprint


class _Signatures:
    """The image's signatures, fetched at most once."""

    def __init__(self, source: SignatureSource) -> None:
        self._source = source
        self._found: list[bytes] | None = None

    def get(self) -> list[bytes]:
        if self._found is None:
            self._found = self._source()
        return self._found


def _signed_by(requirement: Requirement, image: ImageIdentity, digest: Digest,
               signatures: _Signatures) -> str:
    """The fingerprint of the key whose signature meets ``requirement``, else raises."""
    from ocistage.bundler.trust.gpg import GpgMissing, ThrowawayKeyring
    from ocistage.bundler.trust.lookaside import LookasideError

    if requirement.key_type != "GPGKeys":
        raise SignatureRejected(f"keyType {requirement.key_type!r} is not implemented "
                                "(skopeo implements only GPGKeys)")
    try:
        found = signatures.get()
    except LookasideError as exc:
        raise SignatureRejected(str(exc)) from None
    if not found:
        raise SignatureRejected("a signature was required, but no signature exists")
    keys = _keys(requirement)
    if not keys.strip():
        raise SignatureRejected("no public keys in the requirement's keys")
    try:
        ring = ThrowawayKeyring(keys)
    except GpgMissing:
        raise SignatureRejected("gpgv is not installed: signatures cannot be verified "
                                "(apt install gpgv)") from None
    with ring:
        reasons: list[str] = []
        for signature in found:
            try:
                return _accepts(ring, requirement, image, digest, signature)
            except SignatureRejected as exc:
                reasons.append(str(exc))
    if len(reasons) == 1:
        raise SignatureRejected(reasons[0])
    raise SignatureRejected("none of the signatures were accepted: " + "; ".join(
        f"[{n}] {reason}" for n, reason in enumerate(reasons, start=1)))


def evaluate(policy: Policy, image: ImageIdentity, reference: str, digest: Digest,
             signatures: SignatureSource) -> Verdict:
    """The verdict of ``policy`` on the image whose manifest has ``digest``."""
    scope = requirements_for(policy, image)
    source = _Signatures(signatures)
    fingerprint: str | None = None
    deciding: Requirement | None = None
    for requirement in scope.requirements:
        try:
            if requirement.type == "insecureAcceptAnything":
                continue
            if requirement.type == "reject":
                raise SignatureRejected("the policy rejects every image in this scope")
            if requirement.type == "sigstoreSigned":
                raise SignatureRejected(SIGSTORE_REASON)
            if requirement.type == "signedBaseLayer":
                raise SignatureRejected("signedBaseLayer is not implemented (nor in skopeo)")
            fingerprint = _signed_by(requirement, image, digest, source)
            deciding = requirement
        except SignatureRejected as exc:
            return Verdict(False, reference, policy.origin, scope, requirement,
                           reason=str(exc))
    return Verdict(True, reference, policy.origin, scope, deciding or scope.requirements[0],
                   fingerprint)
