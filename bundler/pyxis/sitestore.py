"""A site's store of images that this user only reads (filled by the site): whether it may
be read, and its images."""

from __future__ import annotations

import os
from pathlib import Path

from ocistage.bundler.pyxis.imagestore import present
from ocistage.cache.pyxisimages import IMAGE_DIR, image_path_at


def readable_store(root: Path, *parts: str) -> bool:
    """Whether the store at ``root``, which this user only reads, has ``pyxis/`` (and
    ``parts`` below it); each directory must pass the trust rule (docs/trust.md), else
    :class:`~ocistage.cache.errors.UntrustedPath`. A store the site has not filled yet has
    none, as a store the site has not made: nothing to read there."""
    from ocistage.cache.fsops import check_trusted_dir

    if not os.path.exists(root):
        return False
    check_trusted_dir(root, "pyxis store", group_shared=True, follow=True)
    directory = root / IMAGE_DIR
    for part in ("", *parts):
        directory = directory / part if part else directory
        if not os.path.lexists(directory):
            return False
        check_trusted_dir(directory, "pyxis store directory", group_shared=True)
    return True


def site_image(root: Path, key: str) -> Path | None:
    """The image ``key`` in the read-only site store at ``root``, if it is there and the
    store passes the trust rule (docs/trust.md)."""
    if not readable_store(root):
        return None
    path = image_path_at(root, key)
    return path if present(path) else None
