"""Signatures from a lookaside store: ``BASE/REPO@sha256=HEX/signature-N``, N from 1 until
the first missing one (containers/image's layout), from ``file://`` or ``http(s)://``.

Every signature is hostile: at most :data:`SIGNATURES_LIMIT` of them, each at most
:data:`SIGNATURE_LIMIT` bytes (containers/image's own limits), a local one a regular file,
a remote one fetched with a timeout. A store that cannot be read (not "missing": an error,
a refused connection, a server error) is a :class:`LookasideError`, which rejects the image
as skopeo does.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from ocistage.bundler.trust.boundedread import BoundedReadError, read_regular
from ocistage.cache.digest import Digest

SIGNATURE_LIMIT = 4 << 20
SIGNATURES_LIMIT = 128
TIMEOUT = 30.0


class LookasideError(Exception):
    """The store cannot be read; the message says where and why."""


def signature_url(base: str, repository_path: str, digest: Digest, index: int) -> str:
    parts = urllib.parse.urlsplit(base)
    path = (f"{parts.path}/{repository_path}@{digest.algorithm}={digest.hex}"
            f"/signature-{index}")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _read_file(url: str) -> bytes | None:
    path = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return read_regular(path, SIGNATURE_LIMIT)
    except BoundedReadError as exc:
        raise LookasideError(f"cannot read the signature {path}: {exc}") from None


def _read_http(url: str) -> bytes | None:
    import requests  # only when a store is remote

    try:
        with requests.get(url, stream=True, timeout=TIMEOUT, allow_redirects=True) as response:
            if response.status_code == 404:
                return None
            if response.status_code != 200:
                raise LookasideError(f"reading the signature {url}: status "
                                     f"{response.status_code} ({response.reason})")
            data = bytearray()
            for chunk in response.iter_content(1 << 16):
                data += chunk
                if len(data) > SIGNATURE_LIMIT:
                    raise LookasideError(f"the signature {url} is larger than "
                                         f"{SIGNATURE_LIMIT} bytes")
            return bytes(data)
    except requests.RequestException as exc:
        raise LookasideError(f"reading the signature {url}: {type(exc).__name__}") from None


def fetch_signatures(base: str, repository_path: str, digest: Digest) -> list[bytes]:
    """The signatures of ``digest`` in the store at ``base`` (a list, maybe empty)."""
    scheme = urllib.parse.urlsplit(base).scheme
    if scheme == "file":
        read = _read_file
    elif scheme in ("http", "https"):
        read = _read_http
    else:
        raise LookasideError(f"unsupported scheme of the signature store {base!r} "
                             "(file://, http:// and https:// are read)")
    found: list[bytes] = []
    for index in range(1, SIGNATURES_LIMIT + 2):
        if index > SIGNATURES_LIMIT:
            raise LookasideError(f"more than {SIGNATURES_LIMIT} signatures in {base}")
        data = read(signature_url(base, repository_path, digest, index))
        if data is None:
            break
        found.append(data)
    return found
