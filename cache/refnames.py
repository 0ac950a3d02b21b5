"""The names in the cache's ``index.json``: one ``org.opencontainers.image.ref.name``, one
descriptor, so that skopeo, podman and umoci read the cache as they read any OCI layout.

A pull records each platform of a reference ``REF`` in an entry of its own, a *record*, named
``REF+OS/ARCH[/VARIANT]`` (``+`` cannot occur in a registry reference, so these names never
collide with a real tag) and annotated ``io.ocistage.ref = REF``: ``umoci unpack --image
CACHE:REF+linux/arm64`` takes that platform. ``REF`` itself names one *alias* entry, rewritten
whenever a record of ``REF`` comes or goes: the manifest when one platform is cached, else an
image index of the cached platforms' manifests (what ``skopeo copy --all`` writes for a
multi-platform tag), from which skopeo and podman choose the host's platform or the one asked
for with ``--override-arch``, on every node of a mixed cluster alike.

Caches written before this scheme named every platform's manifest ``REF``: such an entry
(``REF`` on a manifest with a platform, neither annotation) is read as a record of ``REF`` and
renamed at the next change to ``REF``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ocistage.cache.digest import Digest

REF_NAME = "org.opencontainers.image.ref.name"
ANNOTATION_REF = "io.ocistage.ref"              # on a record: the reference it is a platform of
ANNOTATION_PLATFORMS = "io.ocistage.platforms"  # on an alias: the platforms it stands for
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"

Entry = dict[str, Any]


def _annotations(entry: Entry) -> dict[str, Any]:
    annotations = entry.get("annotations")
    return annotations if isinstance(annotations, dict) else {}


def platform_path(platform: object) -> str:
    """``os/arch[/variant]`` of an OCI platform object ("" when there is none)."""
    if not isinstance(platform, dict):
        return ""
    parts = [str(platform.get("os", "")), str(platform.get("architecture", ""))]
    if platform.get("variant"):
        parts.append(str(platform["variant"]))
    return "/".join(parts)


def platform_ref_name(name: str, platform: object) -> str:
    """The ref.name of ``name``'s record for ``platform``."""
    path = platform_path(platform)
    return f"{name}+{path}" if path else name


def is_alias(entry: Entry) -> bool:
    return ANNOTATION_PLATFORMS in _annotations(entry)


def record_name(entry: Entry) -> str | None:
    """The reference ``entry`` records a platform of (None for an alias)."""
    annotations = _annotations(entry)
    if ANNOTATION_PLATFORMS in annotations:
        return None
    name = annotations.get(ANNOTATION_REF, annotations.get(REF_NAME))
    return name if isinstance(name, str) else None


def record(name: str, descriptor: Entry) -> Entry:
    """The index.json entry recording ``descriptor`` (one platform's manifest) for ``name``."""
    entry = dict(descriptor)
    entry["annotations"] = {**_annotations(descriptor), ANNOTATION_REF: name,
                            REF_NAME: platform_ref_name(name, descriptor.get("platform"))}
    return entry


def _descriptor(entry: Entry) -> Entry:
    return {key: entry[key] for key in ("mediaType", "digest", "size", "platform") if key in entry}


def rename(manifests: list[Entry], name: str) -> tuple[list[Entry], bytes | None]:
    """``manifests`` (index.json entries) with ``name``'s records named per platform and its
    alias rewritten; also the index document the alias names, when it names one (the caller
    stores that blob before it publishes the entries)."""
    records = [record(name, m) for m in manifests if record_name(m) == name]
    others = [m for m in manifests if record_name(m) != name
              and not (is_alias(m) and _annotations(m).get(REF_NAME) == name)]
    records.sort(key=lambda m: platform_path(m.get("platform")))
    if not records:
        return others, None
    platforms = ",".join(platform_path(m.get("platform")) for m in records)
    marks = {REF_NAME: name, ANNOTATION_PLATFORMS: platforms}
    if len(records) == 1:
        return [*others, *records, {**_descriptor(records[0]), "annotations": marks}], None
    children = [_descriptor(m) for m in records]
    document = json.dumps({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE,
                           "manifests": children}, indent=2).encode() + b"\n"
    alias = {"mediaType": INDEX_MEDIA_TYPE, "digest": str(Digest.of_bytes(document)),
             "size": len(document), "annotations": marks}
    return [*others, *records, alias], document


def renamed(manifests: list[Entry], names: set[str]) -> tuple[list[Entry], list[bytes]]:
    """``manifests`` with the records and alias of each of ``names`` renamed (:func:`rename`),
    and the index documents the aliases name."""
    documents: list[bytes] = []
    for name in sorted(names):
        manifests, document = rename(manifests, name)
        if document is not None:
            documents.append(document)
    return manifests, documents


def untagged(manifests: list[Entry], match: Callable[[Entry], bool]
             ) -> tuple[list[Entry], list[Entry], list[bytes]]:
    """``manifests`` without the records ``match`` selects, their names' aliases rewritten
    (:func:`renamed`); the records removed; the index documents the aliases name."""
    removed = [m for m in manifests if record_name(m) is not None and match(m)]
    kept = [m for m in manifests if not any(m is r for r in removed)]
    kept, documents = renamed(kept, {str(record_name(m)) for m in removed})
    return kept, removed, documents
