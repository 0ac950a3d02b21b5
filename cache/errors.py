"""Errors of the cache: the store cannot be read or written, a path fails the trust rule, a
lock is held too long (the hierarchy: :mod:`ocistage.errors`)."""

from __future__ import annotations

from ocistage.errors import OcistageError


class StoreError(OcistageError):
    default_hint = (
        "check free space and permissions of the cache directory (--cache / $OCISTAGE_CACHE)"
    )


class UntrustedPath(StoreError):
    """A directory or entry fails the trust rule (docs/trust.md): owned by somebody else, or
    writable by others where ocistage writes or reads back."""

    default_hint = ("use a directory that you (or root) own and that others cannot write, "
                    "e.g. chmod go-w DIR")


class ForeignFile(UntrustedPath):
    """A file ocistage would read back (a marker, a manifest, a lease, a lock) is not a
    regular file of the caller, root or (in a group-shared cache) a member
    (:mod:`ocistage.cache.readback`); whoever meets it treats it as not ours."""


class LockTimeout(StoreError):
    default_hint = "another ocistage process is working on the same item; retry later"
