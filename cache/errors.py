"""The one exception hierarchy of ocistage.

Every package depends on ``cache``, so the hierarchy lives here and the other packages
subclass it. Low-level errors (``OSError``, ``requests`` exceptions, ``tarfile`` errors) are
translated into these in exactly one place each, with ``raise ... from exc``. The CLI renders
them as one ``error: ...`` line plus a ``hint: ...`` line and exits with ``exit_code``.

::

    OcistageError                     exit 1 unless noted
    ├── UsageError                    exit 2: the user's input is malformed
    ├── NotFound                      an image, tag, manifest or blob that is not there
    │                                 (in a registry, a local source or the cache)
    ├── IntegrityError                bytes do not match their digest or declared size
    ├── LayerError                    a layer cannot be applied (bad tar, unsafe entry, budget)
    ├── StoreError                    the cache cannot be read or written (disk full, perms)
    │   ├── UntrustedPath             a directory or entry fails the trust rule (docs/trust.md)
    │   │   └── ForeignFile           a file read back is not a regular file of ours (a FIFO,
    │   │                             another user's file): skipped, never removed or waited for
    │   └── LockTimeout               another process holds a lock for too long
    └── Interrupted                   exit 130: stopped by Ctrl-C (SIGINT); partial downloads kept

Errors that one package raises live with it and subclass these (docs/architecture.md):
:mod:`ocistage.bundler.image.errors` (InvalidReference, SchemaError, UnsupportedManifest),
:mod:`ocistage.bundler.registry.errors` (RegistryError and its kinds),
:mod:`ocistage.bundler.errors` (SourceError), :mod:`ocistage.bundler.trust.errors`
(PolicyError, ImageRejected), :mod:`ocistage.stagers.errors` (StageError),
:mod:`ocistage.runtimes.errors` (SlurmError, ScrunError, UserResolutionError).
"""

from __future__ import annotations


class OcistageError(Exception):
    """Base of all errors ocistage raises on purpose.

    ``message`` says what went wrong (one line, no trailing period needed);
    ``hint`` says what the user can do about it.
    """

    exit_code: int = 1
    default_hint: str | None = None

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def __str__(self) -> str:
        return self.message


class UsageError(OcistageError):
    exit_code = 2


class NotFound(OcistageError):
    default_hint = "check the repository name and tag (`ocistage inspect REF` lists platforms)"


class IntegrityError(OcistageError):
    default_hint = (
        "the data did not match its digest; retry, and if it persists the registry "
        "or a proxy is serving corrupt content"
    )


class LayerError(OcistageError):
    pass


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


class Interrupted(OcistageError):
    """The user stopped the command (SIGINT); what was downloaded so far is kept."""

    exit_code = 130
