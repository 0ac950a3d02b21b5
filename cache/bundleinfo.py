"""What a cached bundle records about itself: the manifest it was made from.

Small on purpose: ``bundle`` writes this on every cached bundle it makes, ``cache ls/gc``
(:mod:`ocistage.cache.inventory`) read it, and importing the inventory's listing machinery costs a
warm
``ocistage bundle`` ~9 ms it does not need.
"""

from __future__ import annotations

import json
from pathlib import Path

from ocistage.cache.digest import Digest
from ocistage.cache.errors import StoreError
from ocistage.cache.fdio import write_new_file
from ocistage.cache.jsondoc import parse_json, read_document
from ocistage.errors import OcistageError

BUNDLE_INFO = ".ocistage-bundle.json"

#: config.json annotation of a bundle whose root is read-only only because its files are shared
#: (hard links) with the cache or other bundles; a private copy of it may be writable again.
SHARED_ROOT_ANNOTATION = "io.ocistage.root-shared"


def write_bundle_info(bundle_dir: Path, manifest: Digest, image: str) -> None:
    """Record which manifest a cached bundle is made from (called before it is published)."""
    data = {"manifest": str(manifest), "image": image}
    try:
        write_new_file(bundle_dir / BUNDLE_INFO, (json.dumps(data) + "\n").encode())
    except OSError as exc:
        raise StoreError(f"cannot write {bundle_dir / BUNDLE_INFO}: {exc.strerror}") from exc


def read_bundle_info(bundle_dir: Path) -> tuple[Digest | None, str | None]:
    try:
        data = parse_json(read_document(bundle_dir / BUNDLE_INFO, 1 << 16, owners="group"))
        return Digest.parse(str(data["manifest"])), str(data.get("image") or "") or None
    except (OSError, ValueError, KeyError, TypeError, OcistageError):
        return None, None
