"""Errors of bundler's own modules: a local image source that cannot be used, an image the
pyxis importer cannot make."""

from __future__ import annotations

from ocistage.cache.errors import OcistageError


class SourceError(OcistageError):
    pass


class PyxisImportError(OcistageError):
    """ocistage-pyxis-importer could not make or hand over an image (bundler/pyxis_import.py)."""


class MissingForCore(OcistageError):
    """``doctor`` found something the core commands need missing (exit 1)."""

    default_hint = "each 'missing' line above says how to fix it"
