"""``ocistage trust show [REF]``: the image policy that applies, scope by scope, and for a REF
whether its signatures satisfy it and which key signed (as ``podman image trust show``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ocistage.bundler.image.platform import host_platform
from ocistage.bundler.image.reference import ImageSource
from ocistage.bundler.pull import PullOptions, resolve
from ocistage.bundler.sources import open_provider
from ocistage.bundler.trust.errors import ImageRejected
from ocistage.bundler.trust.evaluate import Verdict
from ocistage.bundler.trust.files import EffectiveTrust, effective
from ocistage.bundler.trust.policy import Requirements
from ocistage.cache.store import Store
from ocistage.results import Renderer


def _requirements(requirements: Requirements) -> str:
    return "; ".join(requirement.describe() for requirement in requirements)


@dataclass(frozen=True)
class TrustReport:
    trust: EffectiveTrust
    mandatory: bool
    reference: str | None = None
    digest: str | None = None
    verdict: Verdict | None = None

    def scopes(self) -> list[tuple[str, str, Requirements]]:
        policy = self.trust.policy
        rows = [("", "default", policy.default)]
        for transport, scopes in sorted(policy.transports.items()):
            rows += [(transport, scope, requirements)
                     for scope, requirements in sorted(scopes.items())]
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": str(self.trust.policy.path) if self.trust.found else None,
            "mandatory": self.mandatory,
            "registries_d": str(self.trust.registries_d),
            "scopes": [{"transport": transport or None, "scope": scope,
                        "requirements": [r.to_json() for r in requirements]}
                       for transport, scope, requirements in self.scopes()],
            "image": None if self.reference is None else {
                "reference": self.reference, "digest": self.digest,
                **(self.verdict.to_json() if self.verdict else {})},
            "warnings": [str(notice) for notice in self.trust.notices],
        }

    def render(self, out: Renderer) -> None:
        for notice in self.trust.notices:
            out.warning(str(notice))
        if self.trust.found:
            out.line(f"policy: {self.trust.policy.path}"
                     + (" (mandatory for this site)" if self.mandatory else ""))
        else:
            out.line("policy: none (no policy file: every image is accepted)")
        out.line(f"registries.d: {self.trust.registries_d}")
        out.table(("TRANSPORT", "SCOPE", "REQUIREMENTS"),
                  [(transport or "-", scope or '""', _requirements(requirements))
                   for transport, scope, requirements in self.scopes()])
        if self.reference is not None and self.verdict is not None:
            verdict = self.verdict
            out.line()
            out.line(f"{self.reference} ({self.digest}): "
                     + ("accepted" if verdict.accepted else "rejected")
                     + f" by scope {verdict.scope.describe()}")
            if verdict.requirement is not None:
                out.line(f"  requirement: {verdict.requirement.describe()}")
            if verdict.fingerprint:
                out.line(f"  signed by: {verdict.fingerprint}")
            if verdict.reason:
                out.line(f"  reason: {verdict.reason}")


def trust_report(source: ImageSource | None, store: Store, options: PullOptions) -> TrustReport:
    """The report; with ``source``, its manifest is resolved (no layer is fetched) and its
    signatures are judged, without keeping anything."""
    from ocistage.bundler.trust.check import check_image

    trust = effective(options.trust)
    if source is None:
        return TrustReport(trust, options.trust.mandatory)
    wanted = (options.platform or host_platform()).normalized()
    provider = open_provider(source, options.registry)
    try:
        digest = resolve(provider, wanted).manifest_fetched.digest
    finally:
        provider.close()
    try:
        verdict = check_image(options.trust, source, digest, store, warm=False,
                              keep_signatures=False).verdict
    except ImageRejected as exc:
        verdict = exc.verdict
    return TrustReport(trust, options.trust.mandatory, str(source), str(digest), verdict)
