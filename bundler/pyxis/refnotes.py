"""What each reference resolved to, noted in a store's ``pyxis/refs/``: the warm get's way
to an image without the registry."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import NamedTuple

from ocistage.bundler.image.reference import RegistryReference
from ocistage.bundler.pyxis.imagekey import IMAGE_FORMAT
from ocistage.cache.atomicwrite import write_file_atomic
from ocistage.cache.jsondoc import read_document
from ocistage.cache.pyxisimages import IMAGE_DIR, REFS_DIR, image_path_at, is_image


class Noted(NamedTuple):
    """What a reference resolved to: an image's key and the manifest it was made from."""

    key: str
    manifest: str


def record_name(reference: RegistryReference) -> str:
    """The file name of what ``reference`` resolved to on this host's architecture."""
    text = f"{IMAGE_FORMAT}\n{reference}\n{os.uname().machine}"
    return hashlib.sha256(text.encode()).hexdigest() + ".json"


def remember(directory: Path, reference: RegistryReference, key: str, manifest: str) -> None:
    """Note in ``directory`` (a store's trusted ``pyxis/refs``) that ``reference`` is image
    ``key`` (read by :func:`recall`)."""
    data = json.dumps({"reference": str(reference), "key": key, "manifest": manifest,
                       "resolved": time.time()}, sort_keys=True).encode()
    write_file_atomic(directory / record_name(reference), data)


def recall(root: Path, reference: RegistryReference) -> Noted | None:
    """What ``reference`` last resolved to in the store at ``root``, if that image is there
    (an unreadable record is no record)."""
    path = root / IMAGE_DIR / REFS_DIR / record_name(reference)
    try:
        data = json.loads(read_document(path, 64 << 10))
        key, manifest = str(data["key"]), str(data["manifest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not re.fullmatch(r"[0-9a-f]{64}", key) or not is_image(image_path_at(root, key)):
        return None
    return Noted(key, manifest)
