"""The one decision of a pull: is the image with this manifest allowed by the policy?

:func:`check_image` is called by :mod:`ocistage.bundler.pull` once the manifest's digest is
known and before anything else of the image is fetched. A cold pull fetches the signatures
from the lookaside store (and keeps them with the image once it is accepted); a warm one
(the cache's copy) re-verifies the kept ones, fetching them once if none are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from ocistage.bundler.image.reference import ImageSource
from ocistage.bundler.trust.evaluate import Verdict, evaluate
from ocistage.bundler.trust.files import TrustConfig, effective, registries
from ocistage.bundler.trust.scopes import image_identity
from ocistage.cache.digest import Digest
from ocistage.cache.notice import Notice
from ocistage.cache.store import Store


@dataclass(frozen=True)
class TrustResult:
    """The verdict (None: no policy file applies) and notices for the pull's warnings."""

    verdict: Verdict | None
    notices: tuple[Notice, ...] = ()


def check_image(config: TrustConfig, source: ImageSource, digest: Digest, store: Store, *,
                warm: bool, keep_signatures: bool = True) -> TrustResult:
    """The verdict on ``source`` (manifest ``digest``); ImageRejected if it is rejected.
    ``keep_signatures``: keep what was fetched with the image once it is accepted."""
    if not config.enabled:
        return TrustResult(None)
    trust = effective(config)
    if not trust.found:
        return TrustResult(None, trust.notices)
    image = image_identity(source)
    fetched: list[list[bytes]] = []

    def signatures() -> list[bytes]:
        # asked only by a signedBy requirement: a policy without one loads none of this
        from ocistage.bundler.trust.kept import read_kept
        from ocistage.bundler.trust.lookaside import fetch_signatures
        from ocistage.bundler.trust.registriesd import lookaside_base

        if image.docker is None:
            return []  # only registry images have signatures (as for skopeo's oci:)
        if warm:
            kept = read_kept(store, image.docker.name, digest)
            if kept:
                return kept
        base = lookaside_base(registries(trust), image.docker, trust.home)
        found = fetch_signatures(base, image.docker.path, digest)
        fetched.append(found)
        return found

    verdict = evaluate(trust.policy, image, str(source), digest, signatures)
    if not verdict.accepted:
        error = verdict.error()
        if trust.notices:  # the user's own choice was not used: say so where it is seen
            error.hint = "; ".join([*(str(n) for n in trust.notices), error.hint or ""])
        raise error
    if keep_signatures and fetched and fetched[0] and image.docker is not None:
        from ocistage.bundler.trust.kept import keep

        keep(store, image.docker.name, digest, fetched[0])
    return TrustResult(verdict, trust.notices)
