"""The errors of the ``stagers`` package, in the one hierarchy rooted in
:mod:`ocistage.cache.errors`."""

from __future__ import annotations

from ocistage.cache.errors import OcistageError


class StageError(OcistageError):
    """Staging or unstaging failed (source unreadable, target not writable, unsafe path)."""

    default_hint = "check that the source is readable and the target directory is writable"
