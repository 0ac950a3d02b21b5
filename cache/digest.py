"""Content digests (``algorithm:hex``) as used by the OCI specs.

Only ``sha256`` and ``sha512`` are accepted; anything else in a manifest is an error. A digest
is validated once, when it is parsed, so code holding a :class:`Digest` can build paths from it
without further checks (the hex part cannot contain ``/`` or ``..``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from ocistage.errors import IntegrityError, UsageError

if TYPE_CHECKING:
    import hashlib

_HEX_LENGTH = {"sha256": 64, "sha512": 128}
_DIGEST_RE = re.compile(r"^(?P<algorithm>[a-z0-9]+(?:[.+_-][a-z0-9]+)*):(?P<hex>[a-zA-Z0-9=_-]+)$")


@dataclass(frozen=True, order=True)
class Digest:
    algorithm: str
    hex: str

    @classmethod
    def parse(cls, text: str) -> Digest:
        match = _DIGEST_RE.match(text)
        if match is None:
            raise UsageError(f"invalid digest {text!r}", "digests look like sha256:<64 hex digits>")
        algorithm, hexpart = match.group("algorithm"), match.group("hex")
        expected = _HEX_LENGTH.get(algorithm)
        if expected is None:
            raise UsageError(f"unsupported digest algorithm {algorithm!r} in {text!r}",
                             "only sha256 and sha512 digests are supported")
        if len(hexpart) != expected or not re.fullmatch(r"[0-9a-f]+", hexpart):
            raise UsageError(f"invalid {algorithm} digest {text!r}",
                             f"a {algorithm} digest has {expected} lowercase hex digits")
        return cls(algorithm, hexpart)

    @classmethod
    def of_bytes(cls, data: bytes, algorithm: str = "sha256") -> Digest:
        return cls(algorithm, _new(algorithm, data).hexdigest())

    def hasher(self) -> hashlib._Hash:
        return _new(self.algorithm)

    def verify_bytes(self, data: bytes, what: str = "content") -> None:
        actual = _new(self.algorithm, data).hexdigest()
        if actual != self.hex:
            raise IntegrityError(f"{what} has digest {self.algorithm}:{actual}, expected {self}")

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"

    @property
    def short(self) -> str:
        return self.hex[:12]


def hash_file(file: BinaryIO, algorithm: str = "sha256", chunk_size: int = 1 << 20) -> Digest:
    """Digest of a file object's remaining content, read in chunks."""
    hasher = _new(algorithm)
    while chunk := file.read(chunk_size):
        hasher.update(chunk)
    return Digest(algorithm, hasher.hexdigest())


def _new(algorithm: str, data: bytes = b"") -> hashlib._Hash:
    """A hasher of ``algorithm`` (hashlib, imported when first used: loading OpenSSL took
    ~2 ms of commands that hash nothing, such as a re-stage)."""
    import hashlib

    return hashlib.new(algorithm, data)
