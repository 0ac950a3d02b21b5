"""Errors of bundler's own modules: a local image source that cannot be used."""

from __future__ import annotations

from ocistage.cache.errors import OcistageError


class SourceError(OcistageError):
    pass
