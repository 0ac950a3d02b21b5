"""A warning as a value: what kind of thing happened, and its text for a person.

Warnings arise in several layers (unpacking a layer, a pull, the cache's budget, a config
file) and travel up to the CLI, which prints them and aggregates some kinds (every device node
replaced by an empty file becomes one line) by :attr:`Notice.kind`, never by reading the text.
A snapshot keeps the notices of unpacking its layers (:mod:`ocistage.cache.snapshots`) in the
form :meth:`Notice.to_json` gives.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """What a :class:`Notice` is about; the CLI groups by it."""

    DEVICE_NODE = "device-node"   # a device node became an empty regular file (rootless)
    SKIPPED = "skipped"           # a tar entry was not applied (unsupported, AUFS metadata)
    XATTR = "xattr"               # an extended attribute was not set
    PLATFORM = "platform"         # the image is for another platform than the one wanted
    OVER_BUDGET = "over-budget"   # the cache stays over its size budget
    CONFIG = "config"             # a config file has a key that is not known
    PRIVILEGES = "privileges"     # setuid/setgid bits and file capabilities were taken away
    OWNERS = "owners"             # the image's owners could not be restored (not root)
    RUNTIME = "runtime"           # how the bundle must be run here (a runtime's known limits)
    OTHER = "other"               # none of the above (a snapshot's notice of a kind unknown)


@dataclass(frozen=True)
class Notice:
    """One warning: its ``kind``, its ``text``, and the image ``layer`` it is about (if any).
    ``str()`` is how it is shown: ``layer N: TEXT`` or ``TEXT``."""

    kind: Kind
    text: str
    layer: int | None = None

    def __str__(self) -> str:
        return self.text if self.layer is None else f"layer {self.layer}: {self.text}"

    def in_layer(self, layer: int) -> Notice:
        """This notice, about image layer number ``layer``."""
        return dataclasses.replace(self, layer=layer)

    def to_json(self, max_chars: int | None = None) -> dict[str, object]:
        """The notice as a JSON object, its text cut to ``max_chars``."""
        data: dict[str, object] = {"kind": self.kind.value, "text": self.text[:max_chars]}
        if self.layer is not None:
            data["layer"] = self.layer
        return data

    @classmethod
    def from_json(cls, data: object) -> Notice | None:
        """The notice :meth:`to_json` made, or None when ``data`` is not one; an unknown
        kind (written by a later version) is :attr:`Kind.OTHER`."""
        if not isinstance(data, dict):
            return None
        text, kind, layer = data.get("text"), data.get("kind"), data.get("layer")
        if not isinstance(text, str):
            return None
        if not isinstance(layer, int) or isinstance(layer, bool):
            layer = None
        return cls(_KINDS.get(kind, Kind.OTHER) if isinstance(kind, str) else Kind.OTHER,
                   text, layer)


_KINDS = {kind.value: kind for kind in Kind}
