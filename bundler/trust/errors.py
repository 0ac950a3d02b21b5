"""Errors of image trust: a policy that cannot be used, an image the policy rejects."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ocistage.errors import OcistageError

if TYPE_CHECKING:
    from ocistage.bundler.trust.evaluate import Verdict


class PolicyError(OcistageError):
    """The policy file (or registries.d) cannot be read or is not valid: every pull fails."""

    default_hint = ("fix the file (containers-policy.json(5), containers-registries.d(5)); "
                    "docs/trust.md describes what ocistage reads")


class ImageRejected(OcistageError):
    """The policy does not allow the image; ``verdict`` says why (an
    :class:`ocistage.bundler.trust.evaluate.Verdict`)."""

    default_hint = ("ask the site for an image signed by a key its policy trusts; "
                    "`ocistage trust show REF` shows the policy that applies")

    def __init__(self, message: str, hint: str | None = None,
                 verdict: Verdict | None = None) -> None:
        super().__init__(message, hint)
        self.verdict = verdict


class SignatureRejected(Exception):
    """One signature (or one signedBy requirement) is not accepted; the message says why.

    Internal to the evaluation: it becomes the reason of an :class:`ImageRejected`."""
