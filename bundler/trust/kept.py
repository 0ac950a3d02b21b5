"""The signatures kept with a cached image, so that a warm path (``--pull never``, a cached
copy) decides against the current policy without a network.

``CACHE/signatures/sha256-HEX-REPO.json`` holds the signatures (base64) fetched for the
manifest ``sha256:HEX`` of the repository whose name hashes to ``REPO`` (a lookaside store
keeps signatures per repository: the same manifest in another repository has others). They
are verified anew every time, so the file is a cache, not a verdict. It is read back as every
file of the cache is (a regular file of the caller's or root's, bounded).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
from pathlib import Path

from ocistage.bundler.trust.lookaside import SIGNATURE_LIMIT, SIGNATURES_LIMIT
from ocistage.cache.atomicwrite import write_file_atomic
from ocistage.cache.digest import Digest
from ocistage.cache.readback import read_own
from ocistage.cache.store import Store
from ocistage.errors import OcistageError

DIRECTORY = "signatures"
KEPT_LIMIT = 2 * SIGNATURES_LIMIT * SIGNATURE_LIMIT  # base64 and JSON around them


def kept_path(store: Store, repository: str, digest: Digest) -> Path:
    tag = hashlib.sha256(repository.encode()).hexdigest()[:16]
    return store.root / DIRECTORY / f"{digest.algorithm}-{digest.hex}-{tag}.json"


def read_kept(store: Store, repository: str, digest: Digest) -> list[bytes] | None:
    """The kept signatures of ``digest``, or None if none are kept (or the file is bad)."""
    try:
        data = read_own(kept_path(store, repository, digest), KEPT_LIMIT,
                        owners="group" if store.group_shared else "ours")
        listed = json.loads(data)
        if not isinstance(listed, dict) or not isinstance(listed.get("signatures"), list):
            return None
        found = [base64.b64decode(text, validate=True) for text in listed["signatures"]
                 if isinstance(text, str)]
    except (OSError, ValueError, OcistageError, binascii.Error):
        return None
    return found[:SIGNATURES_LIMIT]


def keep(store: Store, repository: str, digest: Digest, signatures: list[bytes]) -> None:
    """Keep ``signatures`` with the image (best effort: a cache that cannot take them
    only means they are fetched again)."""
    if read_kept(store, repository, digest) == signatures[:SIGNATURES_LIMIT]:
        return  # kept already: no write, no fsync
    path = kept_path(store, repository, digest)
    document = json.dumps({"signatures": [base64.b64encode(s).decode() for s in signatures]})
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=store.tree_dir_mode(), exist_ok=True)
        write_file_atomic(path, document.encode(), mode=0o644)
