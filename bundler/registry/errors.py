"""Errors of talking to a registry. A missing repository, tag, manifest or blob is
:class:`ocistage.errors.NotFound`, which the cache raises too."""

from __future__ import annotations

from ocistage.errors import OcistageError, UsageError


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


class CaFileError(UsageError):
    """The extra CA bundle (``--ca-file``, ``$OCISTAGE_CA_FILE``, ``ca_file``) cannot be used:
    missing, unreadable, or without a PEM certificate. Checked before any connection."""

    default_hint = (
        "give --ca-file ($OCISTAGE_CA_FILE, `ca_file` in the config file) a readable PEM file "
        "of CA certificates (-----BEGIN CERTIFICATE-----), e.g. the registry's ca.crt"
    )
