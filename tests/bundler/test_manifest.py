"""Manifests, indexes and image configs: realistic OCI and Docker documents, malformed ones,
and choosing a platform's manifest from an index."""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import pytest

from ocistage.bundler.image import mediatypes as mt
from ocistage.bundler.image.errors import SchemaError, UnsupportedManifest
from ocistage.bundler.image.manifest import (
    MAX_DOCUMENT_SIZE,
    SCHEMA1_HINT,
    Descriptor,
    ImageIndex,
    ImageManifest,
    is_attestation,
    parse_image_config,
    parse_manifest,
    runnable_manifests,
    select_manifest,
)
from ocistage.bundler.image.platform import Platform
from ocistage.cache.digest import Digest


@pytest.fixture(autouse=True, params=["with-schema", "without-schema"])
def schema_module(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run every test with ocistage.bundler.image.schema and without it: the structural checks of
    ocistage.bundler.image.manifest must reject malformed documents on their own too."""
    if request.param == "without-schema":
        monkeypatch.setitem(sys.modules, "ocistage.bundler.image.schema", None)
    return str(request.param)


def sha(n: int) -> str:
    return "sha256:" + f"{n:064x}"


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, indent=3).encode()


OCI_MANIFEST: dict[str, Any] = {
    "schemaVersion": 2,
    "mediaType": mt.OCI_MANIFEST,
    "config": {"mediaType": mt.OCI_CONFIG, "digest": sha(1), "size": 1469},
    "layers": [
        {"mediaType": mt.OCI_LAYER_GZIP, "digest": sha(2), "size": 3408729},
        {"mediaType": mt.OCI_LAYER_ZSTD, "digest": sha(3), "size": 120,
         "annotations": {"org.opencontainers.image.title": "extra"}},
    ],
    "annotations": {"org.opencontainers.image.created": "2024-01-01T00:00:00Z"},
}

DOCKER_MANIFEST: dict[str, Any] = {
    "schemaVersion": 2,
    "mediaType": mt.DOCKER_MANIFEST,
    "config": {"mediaType": mt.DOCKER_CONFIG, "size": 7023, "digest": sha(10)},
    "layers": [
        {"mediaType": mt.DOCKER_LAYER_GZIP, "size": 32654, "digest": sha(11)},
        {"mediaType": mt.DOCKER_LAYER_FOREIGN_GZIP, "size": 73109, "digest": sha(12),
         "urls": ["https://mcr.microsoft.com/v2/windows/blobs/" + sha(12)]},
    ],
}


def _entry(n: int, os: str, arch: str, variant: str | None = None,
           annotations: dict[str, str] | None = None,
           media_type: str = mt.OCI_MANIFEST) -> dict[str, Any]:
    platform: dict[str, Any] = {"os": os, "architecture": arch}
    if variant:
        platform["variant"] = variant
    entry: dict[str, Any] = {"mediaType": media_type, "digest": sha(n), "size": 500 + n,
                             "platform": platform}
    if annotations:
        entry["annotations"] = annotations
    return entry


# Shaped like docker buildx output: images plus attestation manifests.
OCI_INDEX: dict[str, Any] = {
    "schemaVersion": 2,
    "mediaType": mt.OCI_INDEX,
    "manifests": [
        _entry(20, "linux", "amd64"),
        _entry(21, "linux", "arm64", "v8"),
        _entry(22, "linux", "arm", "v7"),
        _entry(23, "linux", "arm", "v6"),
        _entry(24, "unknown", "unknown", annotations={
            "vnd.docker.reference.digest": sha(20),
            "vnd.docker.reference.type": "attestation-manifest"}),
        _entry(25, "unknown", "unknown", annotations={
            "vnd.docker.reference.digest": sha(21),
            "vnd.docker.reference.type": "attestation-manifest"}),
    ],
}

DOCKER_LIST: dict[str, Any] = {
    "schemaVersion": 2,
    "mediaType": mt.DOCKER_MANIFEST_LIST,
    "manifests": [
        _entry(30, "linux", "amd64", media_type=mt.DOCKER_MANIFEST),
        _entry(31, "linux", "arm", "v5", media_type=mt.DOCKER_MANIFEST),
        _entry(32, "linux", "arm64", media_type=mt.DOCKER_MANIFEST),
        _entry(33, "linux", "s390x", media_type=mt.DOCKER_MANIFEST),
        {**_entry(34, "windows", "amd64", media_type=mt.DOCKER_MANIFEST),
         "platform": {"os": "windows", "architecture": "amd64",
                      "os.version": "10.0.17763.5329", "os.features": ["win32k"]}},
    ],
}

DOCKER_CONFIG: dict[str, Any] = {
    "architecture": "amd64",
    "config": {
        "Hostname": "",
        "User": "nginx",
        "ExposedPorts": {"80/tcp": {}},
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "NGINX_VERSION=1.25.3"],
        "Cmd": ["nginx", "-g", "daemon off;"],
        "Image": "sha256:" + "e" * 64,
        "Volumes": {"/var/cache/nginx": {}},
        "WorkingDir": "/srv",
        "Entrypoint": ["/docker-entrypoint.sh"],
        "OnBuild": None,
        "Labels": {"maintainer": "NGINX Docker Maintainers"},
        "StopSignal": "SIGQUIT",
    },
    "created": "2023-11-01T10:00:00.123456789Z",
    "history": [
        {"created": "2023-11-01T09:00:00Z", "created_by": "/bin/sh -c #(nop) ADD file:x in / "},
        {"created": "2023-11-01T09:00:01Z", "created_by": "/bin/sh -c #(nop)  CMD [\"bash\"]",
         "empty_layer": True},
        {"created": "2023-11-01T10:00:00Z", "created_by": "RUN /bin/sh -c apt-get install nginx",
         "comment": "buildkit.dockerfile.v0"},
    ],
    "os": "linux",
    "rootfs": {"type": "layers", "diff_ids": [sha(40), sha(41)]},
}

OCI_CONFIG: dict[str, Any] = {
    "created": "2024-02-01T00:00:00Z",
    "architecture": "arm64",
    "variant": "v8",
    "os": "linux",
    "config": {"Cmd": ["/bin/sh"]},
    "rootfs": {"type": "layers", "diff_ids": [sha(50)]},
}


# -- manifests -----------------------------------------------------------------------------


def test_oci_manifest() -> None:
    data = dumps(OCI_MANIFEST)
    manifest = parse_manifest(data, mt.OCI_MANIFEST)
    assert isinstance(manifest, ImageManifest)
    assert manifest.media_type == mt.OCI_MANIFEST
    assert manifest.config == Descriptor(mt.OCI_CONFIG, Digest.parse(sha(1)), 1469)
    assert [layer.digest for layer in manifest.layers] == [Digest.parse(sha(2)),
                                                           Digest.parse(sha(3))]
    assert manifest.layers[1].annotations == {"org.opencontainers.image.title": "extra"}
    assert manifest.annotations["org.opencontainers.image.created"] == "2024-01-01T00:00:00Z"
    assert manifest.raw == data
    assert "raw" not in repr(manifest)


def test_docker_manifest_with_foreign_layer() -> None:
    manifest = parse_manifest(dumps(DOCKER_MANIFEST), mt.DOCKER_MANIFEST)
    assert isinstance(manifest, ImageManifest)
    assert manifest.media_type == mt.DOCKER_MANIFEST
    assert manifest.config.media_type == mt.DOCKER_CONFIG
    foreign = manifest.layers[1]
    assert foreign.media_type == mt.DOCKER_LAYER_FOREIGN_GZIP
    assert foreign.urls == (f"https://mcr.microsoft.com/v2/windows/blobs/{sha(12)}",)
    assert manifest.annotations == {}


def test_content_type_parameters_and_case_are_ignored() -> None:
    manifest = parse_manifest(dumps(OCI_MANIFEST), mt.OCI_MANIFEST.upper() + "; charset=utf-8")
    assert manifest.media_type == mt.OCI_MANIFEST


@pytest.mark.parametrize("header", [None, "", "application/json", "text/plain",
                                    "application/octet-stream"])
def test_media_type_from_document_when_header_is_generic(header: str | None) -> None:
    assert isinstance(parse_manifest(dumps(DOCKER_MANIFEST), header), ImageManifest)
    assert parse_manifest(dumps(DOCKER_LIST), header).media_type == mt.DOCKER_MANIFEST_LIST


def test_media_type_by_shape() -> None:
    manifest = {k: v for k, v in OCI_MANIFEST.items() if k != "mediaType"}
    index = {k: v for k, v in OCI_INDEX.items() if k != "mediaType"}
    assert parse_manifest(dumps(manifest), None).media_type == mt.OCI_MANIFEST
    assert parse_manifest(dumps(index), None).media_type == mt.OCI_INDEX
    # the header decides when the document does not say
    assert parse_manifest(dumps(index), mt.OCI_INDEX).media_type == mt.OCI_INDEX


def test_header_and_document_must_agree() -> None:
    with pytest.raises(SchemaError, match="served as"):
        parse_manifest(dumps(OCI_MANIFEST), mt.OCI_INDEX)


@pytest.mark.parametrize(("doc", "header"), [
    ({"schemaVersion": 1, "name": "library/alpine", "tag": "latest", "architecture": "amd64",
      "fsLayers": [{"blobSum": sha(1)}], "history": [{"v1Compatibility": "{}"}]}, None),
    ({"schemaVersion": 1, "name": "x", "fsLayers": [], "signatures": []},
     mt.DOCKER_SCHEMA1_SIGNED_MANIFEST),
    (OCI_MANIFEST, mt.DOCKER_SCHEMA1_MANIFEST),
])
def test_schema1_is_refused_with_hint(doc: dict[str, Any], header: str | None) -> None:
    with pytest.raises(UnsupportedManifest, match="schema 1") as info:
        parse_manifest(dumps(doc), header)
    assert info.value.hint == SCHEMA1_HINT


def test_unknown_media_type_is_unsupported() -> None:
    doc = {**OCI_MANIFEST, "mediaType": "application/vnd.example.thing.v1+json"}
    with pytest.raises(UnsupportedManifest, match="unsupported manifest media type"):
        parse_manifest(dumps(doc), None)


def test_artifact_manifest_parses_but_is_not_an_image() -> None:
    doc = copy.deepcopy(OCI_MANIFEST)
    doc["artifactType"] = "application/vnd.example.sbom.v1+json"
    doc["config"] = {"mediaType": mt.OCI_EMPTY, "digest": sha(99), "size": 2}
    manifest = parse_manifest(dumps(doc), mt.OCI_MANIFEST)
    assert isinstance(manifest, ImageManifest)


def _broken(base: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


_DELETE = object()

MALFORMED: list[tuple[str, dict[str, Any]]] = [
    ("no config", _broken(OCI_MANIFEST, ("config",), _DELETE)),
    ("no layers", _broken(OCI_MANIFEST, ("layers",), _DELETE)),
    ("layers not a list", _broken(OCI_MANIFEST, ("layers",), {"a": 1})),
    ("config not an object", _broken(OCI_MANIFEST, ("config",), "sha256:x")),
    ("layer not an object", _broken(OCI_MANIFEST, ("layers", 0), "x")),
    ("bad digest", _broken(OCI_MANIFEST, ("layers", 0, "digest"), "sha256:1234")),
    ("digest not a string", _broken(OCI_MANIFEST, ("layers", 0, "digest"), 5)),
    ("md5 digest", _broken(OCI_MANIFEST, ("config", "digest"), "md5:" + "0" * 32)),
    ("traversal digest", _broken(OCI_MANIFEST, ("config", "digest"), "sha256:../../etc/pw")),
    ("no digest", _broken(OCI_MANIFEST, ("layers", 1, "digest"), _DELETE)),
    ("negative size", _broken(OCI_MANIFEST, ("layers", 0, "size"), -1)),
    ("float size", _broken(OCI_MANIFEST, ("layers", 0, "size"), 1.5)),
    ("string size", _broken(OCI_MANIFEST, ("layers", 0, "size"), "10")),
    ("bool size", _broken(OCI_MANIFEST, ("layers", 0, "size"), True)),
    ("no size", _broken(OCI_MANIFEST, ("config", "size"), _DELETE)),
    ("no layer media type", _broken(OCI_MANIFEST, ("layers", 0, "mediaType"), _DELETE)),
    ("urls not strings", _broken(DOCKER_MANIFEST, ("layers", 1, "urls"), [1])),
    ("annotation not a string", _broken(OCI_MANIFEST, ("annotations",), {"a": 1})),
    ("schemaVersion 3", _broken(OCI_MANIFEST, ("schemaVersion",), 3)),
    ("no schemaVersion", _broken(OCI_MANIFEST, ("schemaVersion",), _DELETE)),
    ("schemaVersion true", _broken(OCI_MANIFEST, ("schemaVersion",), True)),
    ("schemaVersion 2.0", _broken(OCI_MANIFEST, ("schemaVersion",), 2.0)),
    ("schemaVersion string", _broken(OCI_MANIFEST, ("schemaVersion",), "2")),
    ("mediaType not a string", _broken(OCI_MANIFEST, ("mediaType",), 7)),
    ("no manifests", _broken(OCI_INDEX, ("manifests",), _DELETE)),
    ("manifests not a list", _broken(OCI_INDEX, ("manifests",), {})),
    ("platform not an object", _broken(OCI_INDEX, ("manifests", 0, "platform"), "linux")),
    ("platform without os", _broken(OCI_INDEX, ("manifests", 0, "platform", "os"), _DELETE)),
    ("platform arch not a string",
     _broken(OCI_INDEX, ("manifests", 0, "platform", "architecture"), 64)),
    ("index entry bad digest", _broken(OCI_INDEX, ("manifests", 1, "digest"), "sha256:")),
    ("neither shape", {"schemaVersion": 2}),
]


@pytest.mark.parametrize(("name", "doc"), MALFORMED, ids=[n for n, _ in MALFORMED])
def test_malformed_documents_are_schema_errors(name: str, doc: dict[str, Any]) -> None:
    with pytest.raises(SchemaError):
        parse_manifest(dumps(doc), None)


@pytest.mark.parametrize("data", [
    b"", b"not json", b"[]", b'"manifest"', b"null", b"\xff\xfe{}", b'{"a": NaN}',
    b'{"schemaVersion": 2, "schemaVersion": 2}',
    b"[" * 100000 + b"]" * 100000,
])
def test_non_documents_are_schema_errors(data: bytes) -> None:
    with pytest.raises(SchemaError):
        parse_manifest(data, mt.OCI_MANIFEST)


def test_duplicate_keys_are_rejected() -> None:
    # A parser that keeps the first "layers" and one that keeps the last would see different
    # images; refuse the ambiguity.
    text = dumps(OCI_MANIFEST).decode()
    doubled = text.replace('"layers":', '"layers": [], "layers":', 1)
    with pytest.raises(SchemaError, match="duplicate key 'layers'"):
        parse_manifest(doubled.encode(), mt.OCI_MANIFEST)


def test_size_cap() -> None:
    doc = copy.deepcopy(OCI_MANIFEST)
    doc["annotations"]["padding"] = ""
    base = len(dumps(doc))
    doc["annotations"]["padding"] = "x" * (MAX_DOCUMENT_SIZE - base)
    assert len(dumps(doc)) == MAX_DOCUMENT_SIZE
    assert isinstance(parse_manifest(dumps(doc), mt.OCI_MANIFEST), ImageManifest)
    doc["annotations"]["padding"] += "x"
    with pytest.raises(SchemaError, match="4 MiB"):
        parse_manifest(dumps(doc), mt.OCI_MANIFEST)
    with pytest.raises(SchemaError, match="4 MiB"):
        parse_image_config(b" " * (MAX_DOCUMENT_SIZE + 1))


# -- indexes and platform selection ----------------------------------------------------------


def test_oci_index_with_attestations() -> None:
    index = parse_manifest(dumps(OCI_INDEX), mt.OCI_INDEX)
    assert isinstance(index, ImageIndex)
    assert len(index.manifests) == 6
    assert index.manifests[1].platform == Platform("linux", "arm64", "v8")
    assert [is_attestation(d) for d in index.manifests] == [False] * 4 + [True] * 2
    assert len(runnable_manifests(index)) == 4


def test_docker_list_platform_fields() -> None:
    index = parse_manifest(dumps(DOCKER_LIST), mt.DOCKER_MANIFEST_LIST)
    assert isinstance(index, ImageIndex)
    windows = index.manifests[4].platform
    assert windows == Platform("windows", "amd64", None, "10.0.17763.5329", ("win32k",))


def _index(doc: dict[str, Any]) -> ImageIndex:
    index = parse_manifest(dumps(doc), None)
    assert isinstance(index, ImageIndex)
    return index


@pytest.mark.parametrize(("doc", "wanted", "expected"), [
    (OCI_INDEX, "linux/amd64", 20),
    (OCI_INDEX, "linux/arm64", 21),
    (OCI_INDEX, "linux/arm64/v8", 21),
    (OCI_INDEX, "linux/arm/v7", 22),
    (OCI_INDEX, "linux/arm/v6", 23),
    (OCI_INDEX, "linux/arm", 22),
    (DOCKER_LIST, "linux/amd64", 30),
    (DOCKER_LIST, "linux/arm/v7", 31),  # only v5 on offer; a v7 machine runs it
    (DOCKER_LIST, "linux/arm64/v8", 32),  # no variant in the list means v8
    (DOCKER_LIST, "linux/s390x", 33),
    (DOCKER_LIST, "windows/amd64", 34),
])
def test_select_manifest(doc: dict[str, Any], wanted: str, expected: int) -> None:
    chosen = select_manifest(_index(doc), Platform.parse(wanted))
    assert chosen.digest == Digest.parse(sha(expected))


@pytest.mark.parametrize(("doc", "wanted"), [
    (OCI_INDEX, "linux/ppc64le"),
    (OCI_INDEX, "linux/arm/v5"),
    (DOCKER_LIST, "linux/riscv64"),
    (OCI_INDEX, "unknown/unknown"),  # attestations are never chosen
])
def test_select_manifest_lists_available_platforms(doc: dict[str, Any], wanted: str) -> None:
    with pytest.raises(UnsupportedManifest) as info:
        select_manifest(_index(doc), Platform.parse(wanted))
    message = info.value.message
    assert wanted in message
    if doc is OCI_INDEX:
        assert "linux/amd64, linux/arm/v6, linux/arm/v7, linux/arm64/v8" in message
        assert "unknown" not in message.split("available")[1]
    assert "--platform" in (info.value.hint or "")


def test_select_manifest_skips_annotated_attestation_even_with_platform() -> None:
    doc = {"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": [
        _entry(60, "linux", "amd64",
               annotations={"vnd.docker.reference.type": "attestation-manifest"}),
        _entry(61, "linux", "amd64"),
    ]}
    assert select_manifest(_index(doc), Platform.parse("linux/amd64")).digest == (
        Digest.parse(sha(61)))


def test_select_manifest_skips_entries_without_platform_or_not_manifests() -> None:
    nested = _entry(70, "linux", "amd64", media_type=mt.OCI_INDEX)
    no_platform = {k: v for k, v in _entry(71, "linux", "amd64").items() if k != "platform"}
    doc = {"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": [nested, no_platform]}
    with pytest.raises(UnsupportedManifest, match="available: none"):
        select_manifest(_index(doc), Platform.parse("linux/amd64"))


def test_empty_index() -> None:
    doc = {"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": []}
    with pytest.raises(UnsupportedManifest, match="available: none"):
        select_manifest(_index(doc), Platform.parse("linux/amd64"))


# -- image configs ---------------------------------------------------------------------------


def test_docker_image_config() -> None:
    data = dumps(DOCKER_CONFIG)
    config = parse_image_config(data)
    assert (config.os, config.architecture, config.variant) == ("linux", "amd64", None)
    assert config.platform == Platform("linux", "amd64")
    assert config.diff_ids == (Digest.parse(sha(40)), Digest.parse(sha(41)))
    assert config.created == "2023-11-01T10:00:00.123456789Z"
    assert config.raw == data
    assert config.config["Entrypoint"] == ["/docker-entrypoint.sh"]
    assert json.loads(json.dumps(config.config)) == DOCKER_CONFIG["config"]
    settings = config.container
    assert settings.entrypoint == ("/docker-entrypoint.sh",)
    assert settings.cmd == ("nginx", "-g", "daemon off;")
    assert settings.env[1] == "NGINX_VERSION=1.25.3"
    assert settings.user == "nginx"
    assert settings.working_dir == "/srv"
    assert settings.volumes == ("/var/cache/nginx",)
    assert settings.exposed_ports == ("80/tcp",)
    assert settings.labels == {"maintainer": "NGINX Docker Maintainers"}
    assert settings.stop_signal == "SIGQUIT"
    assert [h.empty_layer for h in config.history] == [False, True, False]
    assert config.history[2].comment == "buildkit.dockerfile.v0"
    assert sum(not h.empty_layer for h in config.history) == len(config.diff_ids)


def test_oci_image_config_minimal_and_variant() -> None:
    config = parse_image_config(dumps(OCI_CONFIG))
    assert config.platform == Platform("linux", "arm64", "v8")
    assert config.container.entrypoint is None
    assert config.container.cmd == ("/bin/sh",)
    assert config.container.env == ()
    assert config.history == ()


def test_image_config_without_config_object() -> None:
    for settings in (None, _DELETE):
        doc = _broken(OCI_CONFIG, ("config",), settings)
        config = parse_image_config(dumps(doc))
        assert config.config == {}
        assert config.container.cmd is None


def test_null_fields_in_config_object() -> None:
    doc = _broken(DOCKER_CONFIG, ("config",), {
        "Entrypoint": None, "Cmd": None, "Env": None, "Labels": None, "Volumes": None,
        "ExposedPorts": None, "WorkingDir": "", "User": ""})
    settings = parse_image_config(dumps(doc)).container
    assert (settings.entrypoint, settings.cmd, settings.env) == (None, None, ())
    assert settings.labels == {}
    assert (settings.working_dir, settings.user) == (None, None)


def test_empty_entrypoint_is_not_null() -> None:
    doc = _broken(DOCKER_CONFIG, ("config", "Entrypoint"), [])
    assert parse_image_config(dumps(doc)).container.entrypoint == ()


CONFIG_MALFORMED: list[tuple[str, dict[str, Any]]] = [
    ("no rootfs", _broken(OCI_CONFIG, ("rootfs",), _DELETE)),
    ("rootfs type", _broken(OCI_CONFIG, ("rootfs", "type"), "squashfs")),
    ("no diff_ids", _broken(OCI_CONFIG, ("rootfs", "diff_ids"), _DELETE)),
    ("bad diff_id", _broken(OCI_CONFIG, ("rootfs", "diff_ids"), ["sha256:zz"])),
    ("no architecture", _broken(OCI_CONFIG, ("architecture",), _DELETE)),
    ("no os", _broken(OCI_CONFIG, ("os",), _DELETE)),
    ("os not a string", _broken(OCI_CONFIG, ("os",), ["linux"])),
    ("config not an object", _broken(OCI_CONFIG, ("config",), ["sh"])),
    ("Env not strings", _broken(OCI_CONFIG, ("config", "Env"), ["A=1", 2])),
    ("Cmd not a list", _broken(OCI_CONFIG, ("config", "Cmd"), {"sh": 1})),
    ("Labels not strings", _broken(OCI_CONFIG, ("config", "Labels"), {"a": 1})),
    ("Volumes not an object", _broken(OCI_CONFIG, ("config", "Volumes"), ["/data"])),
    ("User not a string", _broken(OCI_CONFIG, ("config", "User"), 0)),
    ("history not a list", _broken(DOCKER_CONFIG, ("history",), {})),
    ("history entry not an object", _broken(DOCKER_CONFIG, ("history", 0), "x")),
    ("empty_layer not a bool", _broken(DOCKER_CONFIG, ("history", 1, "empty_layer"), "yes")),
]


@pytest.mark.parametrize(("name", "doc"), CONFIG_MALFORMED, ids=[n for n, _ in CONFIG_MALFORMED])
def test_malformed_image_configs(name: str, doc: dict[str, Any]) -> None:
    with pytest.raises(SchemaError):
        parse_image_config(dumps(doc))


def test_image_config_must_be_an_object() -> None:
    with pytest.raises(SchemaError, match="not an object"):
        parse_image_config(b'["config"]')


def test_values_are_immutable() -> None:
    manifest = parse_manifest(dumps(OCI_MANIFEST), None)
    assert isinstance(manifest, ImageManifest)
    with pytest.raises(TypeError):
        manifest.annotations["x"] = "y"  # type: ignore[index]
    assert hash(manifest.layers[0]) == hash(manifest.layers[0])


# -- media types -----------------------------------------------------------------------------


def test_media_type_classes() -> None:
    assert mt.is_index(mt.OCI_INDEX) and mt.is_index(mt.DOCKER_MANIFEST_LIST)
    assert mt.is_manifest(mt.OCI_MANIFEST) and mt.is_manifest(mt.DOCKER_MANIFEST)
    assert mt.is_schema1(mt.DOCKER_SCHEMA1_MANIFEST)
    assert mt.is_schema1(mt.DOCKER_SCHEMA1_SIGNED_MANIFEST + "; charset=utf-8")
    assert not mt.is_manifest(mt.DOCKER_SCHEMA1_MANIFEST)
    assert not mt.is_index(mt.OCI_MANIFEST) and not mt.is_manifest(mt.OCI_INDEX)


def test_accept_header_prefers_indexes_and_lists_schema1_last() -> None:
    assert mt.MANIFEST_ACCEPT[0] == mt.OCI_INDEX
    assert set(mt.MANIFEST_ACCEPT[:4]) == {mt.OCI_INDEX, mt.OCI_MANIFEST,
                                           mt.DOCKER_MANIFEST_LIST, mt.DOCKER_MANIFEST}
    assert all(mt.is_schema1(m) for m in mt.MANIFEST_ACCEPT[4:])
    assert mt.MANIFEST_ACCEPT_HEADER.split(", ") == list(mt.MANIFEST_ACCEPT)
