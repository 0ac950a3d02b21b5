"""What callers of the registry client exchange with it: its configuration, a fetched
manifest, the sink a blob streams into.

Kept apart from :mod:`ocistage.bundler.registry.client`, which needs an HTTP client: code that only
passes these along (pulling from an image layout or the cache, the settings) does not import
``requests`` (~55 ms a process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ocistage.cache.digest import Digest

if TYPE_CHECKING:  # made by the client (and the pyxis importer): a warm pull never needs it
    from ocistage.bundler.registry.credentials import CredentialStore


@dataclass(frozen=True)
class RegistryConfig:
    """How to reach registries; one config serves every client of a run."""

    insecure_registries: frozenset[str] = frozenset()
    ca_file: str | None = None
    ca_file_origin: str = "ca_file"  # where ca_file was given, for the error that names it
    mirrors: Mapping[str, Sequence[str]] = field(default_factory=dict)
    credentials: CredentialStore | None = None
    max_retries: int = 5
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    timeout: float = 60.0           # seconds for one socket read or connect
    deadline: float = 120.0         # seconds for a response's headers, and for a whole
                                    # document (manifest, token, error body)
    min_speed: float = 1024.0       # bytes a second any body must average over speed_window,
    speed_window: float = 30.0      # else it counts as interrupted (and is retried/resumed)
    retry_time: float = 120.0       # no new retry this long after the first try of a request
                                    # (of a blob download: after its last progress)
    user_agent: str = "ocistage/0.1"
    loopback_insecure: bool = True  # localhost/127.0.0.0/8/::1 accept plain HTTP, as Docker does


@dataclass(frozen=True)
class FetchedManifest:
    """A manifest or index as served; ``data`` has been verified against ``digest``."""

    media_type: str
    digest: Digest
    data: bytes


class BlobSink(Protocol):
    """Where a blob's bytes go; the caller verifies the digest when it commits."""

    @property
    def offset(self) -> int: ...

    def write(self, chunk: bytes) -> None: ...

    def restart(self) -> None: ...
