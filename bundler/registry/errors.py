"""Errors of talking to a registry. A missing repository, tag, manifest or blob is
:class:`ocistage.cache.errors.NotFound`, which the cache raises too."""

from __future__ import annotations

from ocistage.cache.errors import OcistageError


class RegistryError(OcistageError):
    pass


class RegistryUnreachable(RegistryError):
    default_hint = (
        "check the registry address and your network; for a plain-HTTP registry "
        "pass --insecure-registry HOST:PORT"
    )


class AuthenticationError(RegistryError):
    default_hint = (
        "log in with `skopeo login`/`docker login`, or check the credentials in "
        "~/.docker/config.json or $REGISTRY_AUTH_FILE"
    )


class RateLimited(RegistryError):
    default_hint = "the registry is rate-limiting you; configure a mirror (--mirror) or retry later"
