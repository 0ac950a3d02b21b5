"""Media types of OCI and Docker image documents and layers, and questions about them.

Media types arrive from two places: the ``Content-Type`` header of a registry response and the
``mediaType`` fields of documents. Both are compared after :func:`normalize`, which drops
parameters (``; charset=utf-8``) and case, so callers never compare raw strings.
"""

from __future__ import annotations

# OCI image-spec v1.1
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
OCI_LAYER_NONDISTRIBUTABLE = "application/vnd.oci.image.layer.nondistributable.v1.tar"
OCI_LAYER_NONDISTRIBUTABLE_GZIP = "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
OCI_LAYER_NONDISTRIBUTABLE_ZSTD = "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"

# Docker image manifest v2, schema 2
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_LAYER_FOREIGN_GZIP = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
# Not in Docker's spec, but written by some tools (containerd knows them).
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
DOCKER_LAYER_ZSTD = "application/vnd.docker.image.rootfs.diff.tar.zstd"

# Docker image manifest v2, schema 1 (deprecated; recognised only to refuse it clearly)
DOCKER_SCHEMA1_MANIFEST = "application/vnd.docker.distribution.manifest.v1+json"
DOCKER_SCHEMA1_SIGNED_MANIFEST = "application/vnd.docker.distribution.manifest.v1+prettyjws"

#: What a manifest GET accepts, most preferred first. Schema 1 comes last so that a registry
#: holding only a schema 1 image answers with it and we can say why we refuse it.
MANIFEST_ACCEPT: tuple[str, ...] = (
    OCI_INDEX,
    OCI_MANIFEST,
    DOCKER_MANIFEST_LIST,
    DOCKER_MANIFEST,
    DOCKER_SCHEMA1_SIGNED_MANIFEST,
    DOCKER_SCHEMA1_MANIFEST,
)
#: :data:`MANIFEST_ACCEPT` as one ``Accept`` header value.
MANIFEST_ACCEPT_HEADER = ", ".join(MANIFEST_ACCEPT)

_INDEXES = frozenset({OCI_INDEX, DOCKER_MANIFEST_LIST})
_MANIFESTS = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
_SCHEMA1 = frozenset({DOCKER_SCHEMA1_MANIFEST, DOCKER_SCHEMA1_SIGNED_MANIFEST})


def normalize(media_type: str) -> str:
    """``media_type`` without parameters, surrounding space or upper case."""
    return media_type.split(";", 1)[0].strip().lower()


def is_index(media_type: str) -> bool:
    """An OCI image index or a Docker manifest list."""
    return normalize(media_type) in _INDEXES


def is_manifest(media_type: str) -> bool:
    """An OCI image manifest or a Docker schema 2 manifest (schema 1 is not included)."""
    return normalize(media_type) in _MANIFESTS


def is_schema1(media_type: str) -> bool:
    """A Docker schema 1 manifest, signed or not."""
    return normalize(media_type) in _SCHEMA1

