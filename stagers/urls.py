"""Telling a URL that bundles are stored at from a directory or an image reference.

URLs are fsspec's (``file://``, ``sftp://``, ``s3://`` ...); telling them apart does not load
the remote machinery (:mod:`ocistage.stagers.remote`) for the directories most stages are."""

from __future__ import annotations

#: ``docker://`` names an image (a reference), not a place to store files
IMAGE_TRANSPORTS = frozenset({"docker"})


def is_url(text: str) -> bool:
    """A fsspec URL (``file://``, ``memory://``, ``sftp://``, ``s3://`` ...), not an image ref."""
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme not in IMAGE_TRANSPORTS
