"""Errors of the front end: image references and registries.

They subclass the one hierarchy in :mod:`cache.errors` (whose base classes every package
shares), so the CLI renders them like any other error: one ``error:`` line, a ``hint:`` line,
exit 1 (2 for :class:`InvalidReference`, a usage error).

::

    UsageError (cache.errors)
    └── InvalidReference              an image reference that does not parse
    OcistageError (cache.errors)
    └── RegistryError                 talking to a registry failed
        ├── RegistryUnreachable       connection refused/reset/timed out after retries
        ├── AuthenticationError       401/403, bad or missing credentials, token issuer failed
        ├── RateLimited               429 after all retries
        └── UnsupportedManifest       schema1, unknown media type, no matching platform

A missing repository, tag, manifest or blob is :class:`cache.errors.NotFound`, which the cache
raises too (an image that is not in the cache).
"""

from __future__ import annotations

from cache.errors import OcistageError, UsageError


class InvalidReference(UsageError):
    default_hint = (
        "references look like [docker://]registry/repo[:tag][@sha256:...], "
        "oci:PATH[:tag], oci-archive:FILE[:tag] or docker-archive:FILE"
    )


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


class UnsupportedManifest(RegistryError):
    pass
