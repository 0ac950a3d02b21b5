"""The one exception hierarchy of ocistage: its base and the errors every package raises.

The base lives at the root of the import name, below every package, and each package
subclasses it in its own ``errors`` module (``cache``: StoreError and its kinds). Low-level
errors (``OSError``, ``requests`` exceptions, ``tarfile`` errors) are translated into these in
exactly one place each, with ``raise ... from exc``. The CLI renders them as one
``error: ...`` line plus a ``hint: ...`` line and exits with ``exit_code``.

::

    OcistageError                     exit 1 unless noted
    ├── UsageError                    exit 2: the user's input is malformed
    ├── NotFound                      an image, tag, manifest or blob that is not there
    │                                 (in a registry, a local source or the cache)
    ├── IntegrityError                bytes do not match their digest or declared size
    ├── LayerError                    a layer cannot be applied (bad tar, unsafe entry, budget)
    ├── StoreError                    the cache cannot be read or written (disk full, perms):
    │                                 ocistage.cache.errors, with its kinds
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


class Interrupted(OcistageError):
    """The user stopped the command (SIGINT); what was downloaded so far is kept."""

    exit_code = 130
