"""Errors of the image model: references that do not parse, documents that fail their
schema, manifests ocistage cannot use. They subclass :mod:`ocistage.errors`."""

from __future__ import annotations

from ocistage.errors import OcistageError, UsageError


class InvalidReference(UsageError):
    default_hint = (
        "references look like [docker://]registry/repo[:tag][@sha256:...], "
        "oci:PATH[:tag], oci-archive:FILE[:tag] or docker-archive:FILE"
    )


class SchemaError(OcistageError):
    pass


class UnsupportedManifest(OcistageError):
    pass
