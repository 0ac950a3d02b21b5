"""Reading JSON documents from untrusted places: size and nesting are bounded.

Documents (manifests, indexes, configs, token replies, error bodies) are capped at
:data:`MAX_DOCUMENT` bytes, as containerd does: an ``index.json`` of 4 GiB is refused, not
read whole.

``json.loads`` recurses per nesting level: a document of 100 000 ``[`` raises RecursionError
(not ValueError), which the callers' ``except ValueError`` let through as a traceback, and a
document just under the interpreter's limit parses but breaks recursive code later. OCI
documents nest a handful of levels; :data:`MAX_DEPTH` leaves room for any real one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ocistage.cache.readback import Owners, read_own

MAX_DEPTH = 100
MAX_DOCUMENT = 4 << 20


def read_document(path: Path, limit: int = MAX_DOCUMENT, *, owners: Owners = "anyone") -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit``: opened by
    :func:`ocistage.cache.readback.open_own` (a symlink is refused: ELOOP; a FIFO or a file of
    an owner ``owners`` does not accept: ForeignFile; never waits).

    Raises OSError as ``open`` does, and ValueError if the file is larger than ``limit``.
    """
    return read_own(path, limit, owners=owners)


def parse_json(data: bytes | str) -> Any:
    """``json.loads(data)``; too deep a document is a ValueError like any malformed one."""
    try:
        value = json.loads(data)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc
    check_depth(value)
    return value


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise ValueError if ``value`` nests lists/dicts more than ``limit`` levels deep."""
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            raise ValueError(f"JSON nested more than {limit} levels deep")
        todo.extend((child, depth + 1) for child in children
                    if isinstance(child, dict | list))


class DuplicateKey(ValueError):
    """A JSON object names one key twice: ``json`` would keep the last value silently, and
    two readers of one document could see different ones (a manifest, a policy, a signed
    payload)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads(..., object_pairs_hook=unique_keys)``: an object, or :class:`DuplicateKey`."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKey(key)
        result[key] = value
    return result
