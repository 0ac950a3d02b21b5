"""Errors of the cache: the store cannot be read or written, a path fails the trust rule, a
lock is held too long (the hierarchy: :mod:`ocistage.errors`); an ``OSError`` becomes one in
:func:`translate_oserror`."""

from __future__ import annotations

import errno

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


#: the hint of an error that finds the cache changed by someone who may write it
TAMPERED_HINT = ("someone with write access to the cache changed it; run `ocistage cache "
                 "verify` and check who else can write the cache directory")


def translate_oserror(exc: OSError, what: str) -> StoreError:
    """The one translation of an ``OSError`` met while ``what`` into a :class:`StoreError`
    (no space left, permission denied, anything else)."""
    if exc.errno == errno.ENOSPC:
        return StoreError(f"no space left on device while {what}",
                          "free space in the cache filesystem or run `ocistage cache gc`")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StoreError(f"permission denied while {what}: {exc.filename or ''}".rstrip(": "))
    return StoreError(f"{what} failed: {exc.strerror or exc}")
