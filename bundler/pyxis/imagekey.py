"""The key of an image: the manifest it is made from, the format of what goes into it and
its compressor (one image per key and store)."""

from __future__ import annotations

import hashlib
import json

#: bump when what goes into an image changes (the files of enroot_files, mksquashfs options)
IMAGE_FORMAT = 2


def image_key(manifest_digest: str, compressor: str) -> str:
    shape = {"format": IMAGE_FORMAT, "manifest": manifest_digest, "compressor": compressor}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()
