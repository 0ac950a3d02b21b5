"""Errors of bundler's own modules: a local image source that cannot be used, a bundle
destination that cannot be made, an image the pyxis importer cannot make."""

from __future__ import annotations

from ocistage.errors import OcistageError


class SourceError(OcistageError):
    pass


class DestinationError(OcistageError):
    """``bundle``'s DEST (or a directory above it) cannot be made."""

    default_hint = ("check that you may write where DEST goes (missing parent directories "
                    "are created)")


class PyxisImportError(OcistageError):
    """ocistage-pyxis-importer could not make or hand over an image (bundler/pyxis/)."""


class MissingForCore(OcistageError):
    """``doctor`` found something the core commands need missing (exit 1)."""

    default_hint = "each 'missing' line above says how to fix it"
