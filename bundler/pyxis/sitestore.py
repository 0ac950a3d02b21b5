"""A site's store of images that this user only reads (filled by the site): whether it may
be read, its images and what references resolved to there."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ocistage.bundler.image.reference import RegistryReference
from ocistage.bundler.pyxis.refnotes import Noted, recall
from ocistage.cache.pyxisimages import (
    IMAGE_DIR,
    REFS_DIR,
    image_path_at,
    is_image,
    retired_since,
)


@dataclass(frozen=True)
class SiteStore:
    """The store at ``root``, which this user cannot write. Users leave no lease and no
    last-use record there; the site's gc retires an image before it removes it, and a retired
    image is not handed out (docs/site.md)."""

    root: Path

    def readable(self, *parts: str) -> bool:
        """Whether the store has ``pyxis/`` (and ``parts`` below it); each directory must
        pass the trust rule (docs/trust.md), else
        :class:`~ocistage.cache.errors.UntrustedPath`. A store the site has not filled yet
        has none, as a store the site has not made: nothing to read there."""
        from ocistage.cache.dirtrust import check_trusted_dir

        if not os.path.exists(self.root):
            return False
        check_trusted_dir(self.root, "pyxis store", group_shared=True, follow=True)
        directory = self.root / IMAGE_DIR
        for part in ("", *parts):
            directory = directory / part if part else directory
            if not os.path.lexists(directory):
                return False
            check_trusted_dir(directory, "pyxis store directory", group_shared=True)
        return True

    def image(self, key: str) -> Path | None:
        """The image ``key``, if it is there, not retired by the site's gc (which removes it
        an hour later: docs/site.md) and the store passes the trust rule."""
        if not self.readable():
            return None
        path = image_path_at(self.root, key)
        return path if is_image(path) and retired_since(self.root, key) is None else None

    def recalled(self, reference: RegistryReference) -> tuple[Path, Noted] | None:
        """The image ``reference`` resolved to before, if the site made it."""
        if not self.readable(REFS_DIR):
            return None
        found = recall(self.root, reference)
        path = self.image(found.key) if found is not None else None
        return (path, found) if path is not None and found is not None else None
