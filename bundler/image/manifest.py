"""Manifests, indexes and image configs: from fetched bytes to typed, validated values.

Documents are small and capped (:data:`MAX_DOCUMENT_SIZE`); anything larger, not UTF-8 JSON,
with duplicate keys, or not of the expected shape raises :class:`SchemaError`. Documents
of a kind we cannot use (schema 1, artifacts, unknown media types) raise
:class:`UnsupportedManifest`. Each document is validated against its OCI/Docker JSON schema
(``ocistage.bundler.image.schema``) and then read field by field, so a value in these types is
always well-formed: digests parse, sizes are non-negative integers, strings are strings.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar, cast

from ocistage.bundler.image import mediatypes
from ocistage.bundler.image.errors import SchemaError, UnsupportedManifest
from ocistage.bundler.image.platform import Platform, select_platform
from ocistage.cache.digest import Digest
from ocistage.cache.jsondoc import unique_keys
from ocistage.errors import UsageError

MAX_DOCUMENT_SIZE = 4 * 1024 * 1024
SCHEMA1_HINT = "re-push the image with a current client (schema 1 images are deprecated)"
ATTESTATION_ANNOTATION = "vnd.docker.reference.type"

_T = TypeVar("_T")

# Header media types that say nothing about the document, so the document decides.
_GENERIC_MEDIA_TYPES = frozenset({"", "application/json", "text/plain", "application/octet-stream"})
_SCHEMA_KINDS = {
    mediatypes.OCI_MANIFEST: "image-manifest",
    mediatypes.OCI_INDEX: "image-index",
    mediatypes.DOCKER_MANIFEST: "docker-manifest",
    mediatypes.DOCKER_MANIFEST_LIST: "docker-manifest-list",
}


def _empty_annotations() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Descriptor:
    """A reference to a blob: what it is, its digest and size, and where else to find it."""

    media_type: str
    digest: Digest
    size: int
    urls: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=_empty_annotations, hash=False)
    platform: Platform | None = None


@dataclass(frozen=True)
class ImageManifest:
    """An OCI image manifest or a Docker schema 2 manifest."""

    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]
    annotations: Mapping[str, str] = field(hash=False)
    raw: bytes = field(repr=False)


@dataclass(frozen=True)
class ImageIndex:
    """An OCI image index or a Docker manifest list."""

    media_type: str
    manifests: tuple[Descriptor, ...]
    annotations: Mapping[str, str] = field(hash=False)
    raw: bytes = field(repr=False)


@dataclass(frozen=True)
class ContainerConfig:
    """The ``config`` object of an image config: how to run the image."""

    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    env: tuple[str, ...] = ()
    working_dir: str | None = None
    user: str | None = None
    volumes: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=_empty_annotations, hash=False)
    exposed_ports: tuple[str, ...] = ()
    stop_signal: str | None = None


@dataclass(frozen=True)
class HistoryEntry:
    created: str | None = None
    created_by: str | None = None
    author: str | None = None
    comment: str | None = None
    empty_layer: bool = False


@dataclass(frozen=True)
class ImageConfig:
    """An OCI / Docker image configuration.

    ``config`` is the document's ``config`` object as parsed JSON (a plain ``dict``, so it can
    be serialised again; ``{}`` when absent or null), with the types of its known fields
    checked; ``container`` is the same settings as typed values.
    """

    architecture: str
    os: str
    variant: str | None
    config: Mapping[str, Any] = field(hash=False)
    diff_ids: tuple[Digest, ...]
    history: tuple[HistoryEntry, ...]
    created: str | None
    raw: bytes = field(repr=False)
    os_version: str | None = None
    os_features: tuple[str, ...] = ()
    container: ContainerConfig = field(default_factory=lambda: ContainerConfig())

    @property
    def platform(self) -> Platform:
        return Platform(self.os, self.architecture, self.variant, self.os_version,
                        self.os_features)


def parse_manifest(data: bytes, media_type: str | None, *,
                   validated: bool = False) -> ImageManifest | ImageIndex:
    """Parse a manifest or index; ``media_type`` is the response's Content-Type, if any.

    ``validated``: these very bytes (same digest) passed the schema before, when a pull
    recorded them, so the JSON-schema pass is skipped (the structural checks here still run).
    """
    doc = _load_document(data, "manifest")
    kind = _manifest_media_type(doc, media_type)
    if not validated:
        _validate_schema(doc, _SCHEMA_KINDS[kind])
    annotations = _string_map(doc.get("annotations"), "annotations")
    if mediatypes.is_index(kind):
        entries = _require(doc, "manifests", list, "index")
        manifests = tuple(parse_descriptor(item, f"manifests[{i}]")
                          for i, item in enumerate(entries))
        return ImageIndex(kind, manifests, annotations, data)
    config = parse_descriptor(_require(doc, "config", dict, "manifest"), "config")
    layer_list = _require(doc, "layers", list, "manifest")
    layers = tuple(parse_descriptor(item, f"layers[{i}]") for i, item in enumerate(layer_list))
    return ImageManifest(kind, config, layers, annotations, data)


def is_attestation(descriptor: Descriptor) -> bool:
    """An index entry that is an attestation or other non-runnable artifact, not an image."""
    if ATTESTATION_ANNOTATION in descriptor.annotations:
        return True
    platform = descriptor.platform
    return platform is not None and platform.os == "unknown" and platform.architecture == "unknown"


def runnable_manifests(index: ImageIndex) -> tuple[Descriptor, ...]:
    """The index entries that are images for some platform (attestations skipped)."""
    return tuple(d for d in index.manifests
                 if d.platform is not None and mediatypes.is_manifest(d.media_type)
                 and not is_attestation(d))


def select_manifest(index: ImageIndex, wanted: Platform) -> Descriptor:
    """The index entry to run on ``wanted``; raises UnsupportedManifest listing the choices."""
    candidates = runnable_manifests(index)
    choice = select_platform([cast(Platform, d.platform) for d in candidates], wanted)
    if choice is not None:
        return candidates[choice]
    available = sorted({str(cast(Platform, d.platform)) for d in candidates})
    listed = ", ".join(available) if available else "none"
    raise UnsupportedManifest(f"no image for platform {wanted} (available: {listed})",
                              "choose one of the available platforms with --platform")


def parse_image_config(data: bytes, *, validated: bool = False) -> ImageConfig:
    """Parse an image configuration blob (``validated``: as for :func:`parse_manifest`)."""
    doc = _load_document(data, "image config")
    if not validated:
        _validate_schema(doc, "image-config")
    architecture = _require(doc, "architecture", str, "image config")
    os_name = _require(doc, "os", str, "image config")
    rootfs = _require(doc, "rootfs", dict, "image config")
    if rootfs.get("type") != "layers":
        raise SchemaError(f"image config rootfs.type is {rootfs.get('type')!r}, not 'layers'")
    diff_ids = tuple(_digest(item, f"rootfs.diff_ids[{i}]")
                     for i, item in enumerate(_require(rootfs, "diff_ids", list, "rootfs")))
    history = doc.get("history")
    if history is not None and not isinstance(history, list):
        raise SchemaError("image config history is not a list")
    settings = doc.get("config")
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise SchemaError("image config field 'config' is not an object")
    return ImageConfig(
        architecture=architecture,
        os=os_name,
        variant=_optional(doc, "variant", str, "image config") or None,
        config=settings,
        container=_container_config(settings),
        diff_ids=diff_ids,
        history=tuple(_history(item, i) for i, item in enumerate(history or ())),
        created=_optional(doc, "created", str, "image config"),
        raw=data,
        os_version=_optional(doc, "os.version", str, "image config"),
        os_features=_string_tuple(doc.get("os.features"), "os.features"),
    )


# -- reading JSON -------------------------------------------------------------------------


def _load_document(data: bytes, what: str) -> dict[str, Any]:
    if len(data) > MAX_DOCUMENT_SIZE:
        raise SchemaError(f"{what} is {len(data)} bytes, more than the "
                          f"{MAX_DOCUMENT_SIZE // (1024 * 1024)} MiB limit",
                          "the registry or source is serving something that is not a " + what)
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=unique_keys,
                         parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SchemaError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise SchemaError(f"{what} is a JSON {type(doc).__name__}, not an object")
    return doc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _manifest_media_type(doc: Mapping[str, Any], header: str | None) -> str:
    """The media type a manifest document is, from header, ``mediaType`` field or shape."""
    from_header, from_doc, version = _declared_media_types(doc, header)
    if from_header and from_doc and from_header != from_doc:
        raise SchemaError(f"manifest is served as {from_header} but says it is {from_doc}",
                          "the registry or a proxy is rewriting content types")
    kind = from_header or from_doc or _media_type_by_shape(doc)
    if kind not in _SCHEMA_KINDS:
        raise UnsupportedManifest(f"unsupported manifest media type {kind!r}",
                                  "ocistage reads OCI and Docker schema 2 images")
    if version != 2:
        raise SchemaError(f"manifest schemaVersion is {doc.get('schemaVersion')!r}, expected 2")
    return kind


def _declared_media_types(doc: Mapping[str, Any],
                          header: str | None) -> tuple[str, str, int | None]:
    """The media types the header (unless generic) and the ``mediaType`` field declare
    (normalized, "" for none) and the integer ``schemaVersion`` (else None); a Docker
    schema 1 manifest is refused here."""
    declared = doc.get("mediaType")
    if declared is not None and not isinstance(declared, str):
        raise SchemaError("manifest mediaType is not a string")
    from_header = mediatypes.normalize(header or "")
    from_doc = mediatypes.normalize(declared) if declared else ""
    version = doc.get("schemaVersion")
    if type(version) is not int:  # bool is an int subclass, and 2.0 == 2: be exact
        version = None
    if version == 1 or mediatypes.is_schema1(from_header) or mediatypes.is_schema1(from_doc):
        raise UnsupportedManifest("the image has a Docker schema 1 manifest", SCHEMA1_HINT)
    if from_header in _GENERIC_MEDIA_TYPES:
        from_header = ""
    return from_header, from_doc, version


def _media_type_by_shape(doc: Mapping[str, Any]) -> str:
    if "manifests" in doc and "layers" not in doc:
        return mediatypes.OCI_INDEX
    if "layers" in doc and "manifests" not in doc:
        return mediatypes.OCI_MANIFEST
    raise SchemaError("manifest has no mediaType and is neither an index nor an image manifest")


def _validate_schema(doc: Mapping[str, Any], kind: str) -> None:
    """Validate with ``ocistage.bundler.image.schema`` when it is installed (it is a separate
    component)."""
    try:
        module = importlib.import_module("ocistage.bundler.image.schema")
    except ModuleNotFoundError as exc:
        if exc.name == "ocistage.bundler.image.schema":
            return
        raise
    validate = cast(Callable[[Any, str], None], module.validate)
    validate(doc, kind)


def parse_descriptor(item: Any, where: str) -> Descriptor:
    """A descriptor (an index entry, a manifest's config or layer) as JSON; SchemaError if not."""
    if not isinstance(item, dict):
        raise SchemaError(f"{where} is not a descriptor object")
    media_type = _require(item, "mediaType", str, where)
    size = item.get("size")
    if type(size) is not int or size < 0:
        raise SchemaError(f"{where}.size is {size!r}, not a non-negative integer")
    platform_doc = item.get("platform")
    return Descriptor(
        media_type=media_type,
        digest=_digest(item.get("digest"), f"{where}.digest"),
        size=size,
        urls=_string_tuple(item.get("urls"), f"{where}.urls"),
        annotations=_string_map(item.get("annotations"), f"{where}.annotations"),
        platform=None if platform_doc is None else _platform(platform_doc, f"{where}.platform"),
    )


def _platform(item: Any, where: str) -> Platform:
    if not isinstance(item, dict):
        raise SchemaError(f"{where} is not an object")
    return Platform(
        os=_require(item, "os", str, where),
        architecture=_require(item, "architecture", str, where),
        variant=_optional(item, "variant", str, where) or None,
        os_version=_optional(item, "os.version", str, where) or None,
        os_features=_string_tuple(item.get("os.features"), f"{where}.os.features"),
    )


def _digest(value: Any, where: str) -> Digest:
    if not isinstance(value, str):
        raise SchemaError(f"{where} is {value!r}, not a digest string")
    try:
        return Digest.parse(value)
    except UsageError as exc:
        raise SchemaError(f"{where}: {exc.message}", exc.hint) from exc


def _container_config(item: Mapping[str, Any]) -> ContainerConfig:
    where = "config"
    return ContainerConfig(
        entrypoint=_command(item.get("Entrypoint"), f"{where}.Entrypoint"),
        cmd=_command(item.get("Cmd"), f"{where}.Cmd"),
        env=_string_tuple(item.get("Env"), f"{where}.Env"),
        working_dir=_optional(item, "WorkingDir", str, where) or None,
        user=_optional(item, "User", str, where) or None,
        volumes=_object_keys(item.get("Volumes"), f"{where}.Volumes"),
        labels=_string_map(item.get("Labels"), f"{where}.Labels"),
        exposed_ports=_object_keys(item.get("ExposedPorts"), f"{where}.ExposedPorts"),
        stop_signal=_optional(item, "StopSignal", str, where) or None,
    )


def _command(value: Any, where: str) -> tuple[str, ...] | None:
    """Entrypoint/Cmd: null, a list of strings, or (as Docker also accepts) one string."""
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    return _string_tuple(value, where)


def _history(item: Any, index: int) -> HistoryEntry:
    where = f"history[{index}]"
    if not isinstance(item, dict):
        raise SchemaError(f"image config {where} is not an object")
    empty = item.get("empty_layer", False)
    if not isinstance(empty, bool):
        raise SchemaError(f"image config {where}.empty_layer is not a boolean")
    return HistoryEntry(
        created=_optional(item, "created", str, where),
        created_by=_optional(item, "created_by", str, where),
        author=_optional(item, "author", str, where),
        comment=_optional(item, "comment", str, where),
        empty_layer=empty,
    )


def _require(doc: Mapping[str, Any], key: str, kind: type[_T], where: str) -> _T:
    value = doc.get(key)
    if not isinstance(value, kind):
        state = "is missing" if value is None else f"is {_json_name(type(value))}"
        raise SchemaError(f"{where} field {key!r} {state}, expected {_json_name(kind)}")
    return value


def _optional(doc: Mapping[str, Any], key: str, kind: type[_T], where: str) -> _T | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, kind):
        raise SchemaError(f"{where} field {key!r} is {_json_name(type(value))}, "
                          f"expected {_json_name(kind)}")
    return value


def _string_tuple(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SchemaError(f"{where} is not a list of strings")
    return tuple(cast(Sequence[str], value))


def _string_map(value: Any, where: str) -> Mapping[str, str]:
    if value is None:
        return _empty_annotations()
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SchemaError(f"{where} is not an object of strings")
    return MappingProxyType(dict(value))


def _object_keys(value: Any, where: str) -> tuple[str, ...]:
    """Volumes / ExposedPorts: an object whose keys matter (values are empty objects)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise SchemaError(f"{where} is not an object")
    return tuple(value)


def _json_name(kind: type) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number"}
    return names.get(kind, kind.__name__)
