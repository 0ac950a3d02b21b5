"""The names a registry request is built from.

Repository names and tags checked as the distribution API spells them, a registry's API host,
a pull's token scope and the base URLs of a registry or mirror."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ocistage.bundler.image.errors import InvalidReference
from ocistage.bundler.registry.transport import TlsPolicy
from ocistage.cache.digest import Digest

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REPOSITORY_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def validate_repository(repository: str) -> None:
    if not _REPOSITORY_RE.match(repository) or len(repository) > 255:
        raise InvalidReference(f"invalid repository name {repository!r}")


def validate_reference(reference: str) -> Digest | None:
    """The digest if ``reference`` is one; raises for a malformed tag."""
    if ":" in reference:
        return Digest.parse(reference)
    if not _TAG_RE.match(reference):
        raise InvalidReference(f"invalid tag {reference!r}")
    return None


def api_host(registry: str) -> str:
    return DOCKER_HUB_API if registry in (DOCKER_HUB, "index.docker.io") else registry


def pull_scope(repository: str) -> str:
    return f"repository:{repository}:pull"


def base_urls(location: str, tls: TlsPolicy) -> tuple[str, list[str]]:
    """``host[:port]`` and the base URLs to try for a registry or mirror, in order.

    A URL with a scheme is used as is. A bare ``host[:port]`` is HTTPS; an insecure host
    (listed, or loopback by default) is tried with unverified HTTPS first, then plain HTTP.
    ``docker.io`` means its API host ``registry-1.docker.io``.
    """
    location = location.rstrip("/")
    if "://" in location:
        parts = urlsplit(location)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidReference(f"invalid mirror URL {location!r}",
                                   "mirrors look like https://host[:port]")
        return parts.netloc, [location]
    name = api_host(location)
    if tls.is_insecure(name):
        return name, [f"https://{name}", f"http://{name}"]
    return name, [f"https://{name}"]


