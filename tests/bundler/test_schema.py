"""ocistage.bundler.image.schema: our OCI schemas accept real documents and name the path of the
first problem."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ocistage.bundler.image.errors import SchemaError
from ocistage.bundler.image.schema import KINDS, Kind, validate
from pytest_ocistage.components import require_binary

SHA_A = "sha256:" + "a" * 64
SHA_B = "sha256:" + "b" * 64
SHA_C = "sha256:" + "c" * 64

OCI_MANIFEST: dict[str, Any] = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": SHA_A,
               "size": 581},
    "layers": [
        {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": SHA_B,
         "size": 3408729},
        {"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd", "digest": SHA_C,
         "size": 12, "annotations": {"org.opencontainers.image.title": "x.tar.zst"}},
    ],
    "annotations": {"org.opencontainers.image.created": "2024-01-01T00:00:00Z"},
}

OCI_ARTIFACT: dict[str, Any] = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "artifactType": "application/vnd.example.sbom.v1",
    "config": {"mediaType": "application/vnd.oci.empty.v1+json",
               "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
               "size": 2, "data": "e30="},
    "layers": [],
    "subject": {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": SHA_A,
                "size": 1234},
}

OCI_INDEX: dict[str, Any] = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": SHA_A,
         "size": 1022, "platform": {"architecture": "amd64", "os": "linux"}},
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": SHA_B,
         "size": 1022, "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"}},
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": SHA_C,
         "size": 566, "annotations": {"vnd.docker.reference.type": "attestation-manifest",
                                      "vnd.docker.reference.digest": SHA_A},
         "platform": {"architecture": "unknown", "os": "unknown"}},
    ],
}

# The shape `docker inspect`/registries serve: nulls for empty fields, Docker-only keys.
IMAGE_CONFIG: dict[str, Any] = {
    "architecture": "amd64",
    "os": "linux",
    "created": "2024-02-27T18:52:59.380135891Z",
    "docker_version": "20.10.23",
    "container_config": {"Hostname": "abc", "Cmd": ["/bin/sh"]},
    "config": {
        "Hostname": "",
        "User": "app:app",
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"],
        "Entrypoint": None,
        "Cmd": ["/bin/sh"],
        "Volumes": None,
        "WorkingDir": "/srv",
        "ExposedPorts": {"8080/tcp": {}},
        "Labels": {"org.opencontainers.image.version": "1.0"},
        "OnBuild": None,
        "StopSignal": "SIGTERM",
    },
    "rootfs": {"type": "layers", "diff_ids": [SHA_B, SHA_C]},
    "history": [{"created": "2024-02-27T18:52:59Z", "created_by": "/bin/sh -c #(nop) ADD",
                 "empty_layer": False}],
}

DOCKER_MANIFEST: dict[str, Any] = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
    "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 1469,
               "digest": SHA_A},
    "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "size": 3374563, "digest": SHA_B},
               {"mediaType": "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
                "size": 1, "digest": SHA_C, "urls": ["https://example.com/layer"]}],
}

DOCKER_LIST: dict[str, Any] = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
    "manifests": [
        {"mediaType": "application/vnd.docker.distribution.manifest.v2+json", "size": 528,
         "digest": SHA_A, "platform": {"architecture": "amd64", "os": "linux"}},
        {"mediaType": "application/vnd.docker.distribution.manifest.v2+json", "size": 528,
         "digest": SHA_B, "platform": {"architecture": "arm", "os": "linux", "variant": "v7"}},
    ],
}

MINIMAL_RUNTIME: dict[str, Any] = {
    "ociVersion": "1.2.0",
    "root": {"path": "rootfs"},
    "process": {"cwd": "/", "args": ["sh"], "user": {"uid": 0, "gid": 0}},
    "linux": {"namespaces": [{"type": "mount"}]},
}

SAMPLES: dict[Kind, dict[str, Any]] = {
    "image-manifest": OCI_MANIFEST,
    "image-index": OCI_INDEX,
    "image-config": IMAGE_CONFIG,
    "docker-manifest": DOCKER_MANIFEST,
    "docker-manifest-list": DOCKER_LIST,
    "runtime-config": MINIMAL_RUNTIME,
}


def runtime_spec(tool: str, tmp_path: Path, *flags: str) -> dict[str, Any]:
    subprocess.run([require_binary(tool), "spec", *flags], cwd=tmp_path, check=True, timeout=30)
    document = json.loads((tmp_path / "config.json").read_text())
    assert isinstance(document, dict)
    return document


@pytest.mark.parametrize("kind", KINDS)
def test_samples_of_real_shapes_validate(kind: Kind) -> None:
    validate(copy.deepcopy(SAMPLES[kind]), kind)


def test_artifact_manifest_with_empty_config_validates() -> None:
    validate(OCI_ARTIFACT, "image-manifest")


@pytest.mark.parametrize("tool", ["runc", "crun"])
@pytest.mark.parametrize("flags", [("--rootless",), ()])
def test_runtime_generated_specs_validate(tool: str, flags: tuple[str, ...],
                                          tmp_path: Path) -> None:
    validate(runtime_spec(tool, tmp_path, *flags), "runtime-config")


Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: object) -> Mutation:
    def mutate(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = document
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        if last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value
    return mutate


def _delete(path: str) -> Mutation:
    def mutate(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = document
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        del node[last]
    return mutate


RUNTIME_BREAKAGES: list[tuple[str, Mutation, str]] = [
    ("missing ociVersion", _delete("ociVersion"), "$: missing required property 'ociVersion'"),
    ("ociVersion not semver", _set("ociVersion", "one"), "$.ociVersion"),
    ("args not an array", _set("process.args", "sh -c true"), "$.process.args: expected array"),
    ("args empty", _set("process.args", []), "$.process.args"),
    ("cwd relative", _set("process.cwd", "srv"), "$.process.cwd"),
    ("bad namespace type", _set("linux.namespaces.0", {"type": "net"}),
     "$.linux.namespaces[0].type"),
    ("uidMappings without size",
     _set("linux.uidMappings", [{"containerID": 0, "hostID": 1000}]),
     "$.linux.uidMappings[0]: missing required property 'size'"),
    ("mapping hostID negative",
     _set("linux.gidMappings", [{"containerID": 0, "hostID": -1, "size": 1}]),
     "$.linux.gidMappings[0].hostID"),
    ("mount without destination", _set("mounts", [{"source": "proc", "type": "proc"}]),
     "$.mounts[0]: missing required property 'destination'"),
    ("mount options not strings", _set("mounts", [{"destination": "/x", "options": [1]}]),
     "$.mounts[0].options[0]"),
    ("uid too large", _set("process.user.uid", 2**32), "$.process.user.uid"),
    ("env entry without =", _set("process.env", ["PATH"]), "$.process.env[0]"),
    ("capability lowercase",
     _set("process.capabilities", {"bounding": ["cap_kill"]}),
     "$.process.capabilities.bounding[0]"),
    ("rlimit without hard", _set("process.rlimits", [{"type": "RLIMIT_NOFILE", "soft": 1}]),
     "$.process.rlimits[0]"),
    ("hook path relative", _set("hooks", {"prestart": [{"path": "hook"}]}),
     "$.hooks.prestart[0].path"),
    ("annotation value not string", _set("annotations", {"a": 1}), "$.annotations.a"),
    ("root without path", _set("root", {"readonly": True}), "$.root"),
    ("maskedPaths relative", _set("linux.maskedPaths", ["proc/kcore"]),
     "$.linux.maskedPaths[0]"),
    ("seccomp bad action", _set("linux.seccomp", {"defaultAction": "ALLOW"}),
     "$.linux.seccomp.defaultAction"),
    ("resources pids not integer", _set("linux.resources", {"pids": {"limit": "10"}}),
     "$.linux.resources.pids.limit"),
]


@pytest.mark.parametrize(("case", "mutate", "expected"), RUNTIME_BREAKAGES,
                         ids=[case for case, _, _ in RUNTIME_BREAKAGES])
def test_broken_runtime_configs_fail_with_their_path(case: str, mutate: Mutation,
                                                      expected: str) -> None:
    document = copy.deepcopy(MINIMAL_RUNTIME)
    mutate(document)
    with pytest.raises(SchemaError) as info:
        validate(document, "runtime-config")
    assert expected in str(info.value), case
    assert str(info.value).startswith("runtime-config: ")
    assert info.value.hint


def test_broken_variant_of_real_runc_spec_fails(tmp_path: Path) -> None:
    document = runtime_spec("runc", tmp_path, "--rootless")
    del document["linux"]["uidMappings"][0]["size"]
    with pytest.raises(SchemaError, match=r"\$\.linux\.uidMappings\[0\]"):
        validate(document, "runtime-config")


IMAGE_BREAKAGES: list[tuple[Kind, Mutation, str]] = [
    ("image-manifest", _set("config.digest", "sha256:1234"), "$.config.digest"),
    ("image-manifest", _set("layers.0.digest", "sha256:" + "A" * 64), "$.layers[0].digest"),
    ("image-manifest", _set("layers.0.digest", "md5:" + "a" * 32 + "/.."),
     "$.layers[0].digest"),
    ("image-manifest", _set("mediaType", "application/vnd.oci.image.index.v1+json"),
     "$.mediaType"),
    ("image-manifest", _set("layers", {"0": {}}), "$.layers: expected array"),
    ("image-manifest", _set("layers.1.size", -1), "$.layers[1].size"),
    ("image-manifest", _set("config.size", "581"), "$.config.size"),
    ("image-manifest", _set("schemaVersion", 1), "$.schemaVersion"),
    ("image-manifest", _delete("config"), "missing required property 'config'"),
    ("image-manifest", _set("config.mediaType", "not a media type"), "$.config.mediaType"),
    ("image-manifest", _set("annotations", {"k": 1}), "$.annotations.k"),
    ("image-index", _set("manifests.0.platform", {"os": "linux"}),
     "$.manifests[0].platform: missing required property 'architecture'"),
    ("image-index", _set("manifests", None), "$.manifests"),
    ("image-index", _set("mediaType", "application/vnd.oci.image.manifest.v1+json"),
     "$.mediaType"),
    ("image-config", _set("rootfs.type", "tarball"), "$.rootfs.type"),
    ("image-config", _set("rootfs.diff_ids", ["sha256:xyz"]), "$.rootfs.diff_ids[0]"),
    ("image-config", _delete("architecture"), "missing required property 'architecture'"),
    ("image-config", _set("config.Cmd", "/bin/sh"), "$.config.Cmd"),
    ("image-config", _set("config.Labels", {"a": 1}), "$.config.Labels.a"),
    ("docker-manifest", _set("config.mediaType", "application/vnd.oci.image.config.v1+json"),
     "$.config.mediaType"),
    ("docker-manifest", _set("layers.0.mediaType", "text/plain"), "$.layers[0].mediaType"),
    ("docker-manifest", _delete("mediaType"), "missing required property 'mediaType'"),
    ("docker-manifest-list", _delete("manifests.0.platform"),
     "$.manifests[0]: missing required property 'platform'"),
    ("docker-manifest-list", _set("manifests.1.size", -5), "$.manifests[1].size"),
]


@pytest.mark.parametrize(("kind", "mutate", "expected"), IMAGE_BREAKAGES,
                         ids=[f"{kind}-{n}" for n, (kind, _, _) in enumerate(IMAGE_BREAKAGES)])
def test_broken_image_documents_fail_with_their_path(kind: Kind, mutate: Mutation,
                                                     expected: str) -> None:
    document = copy.deepcopy(SAMPLES[kind])
    mutate(document)
    with pytest.raises(SchemaError) as info:
        validate(document, kind)
    assert expected in str(info.value)
    assert str(info.value).startswith(f"{kind}: ")


def test_empty_config_descriptor_requires_artifact_type() -> None:
    document = copy.deepcopy(OCI_ARTIFACT)
    del document["artifactType"]
    with pytest.raises(SchemaError, match="artifactType"):
        validate(document, "image-manifest")


def test_docker_manifest_is_not_an_oci_manifest() -> None:
    with pytest.raises(SchemaError, match=r"\$\.mediaType"):
        validate(DOCKER_MANIFEST, "image-manifest")


@pytest.mark.parametrize("document", [[], "text", None, 3])
def test_non_object_documents_fail_at_root(document: object) -> None:
    with pytest.raises(SchemaError, match=r"^image-manifest: \$: expected object"):
        validate(document, "image-manifest")


def test_message_bounds_huge_values() -> None:
    document = copy.deepcopy(OCI_MANIFEST)
    document["config"]["digest"] = "x" * 100_000
    with pytest.raises(SchemaError) as info:
        validate(document, "image-manifest")
    assert len(str(info.value)) < 600


def test_unknown_kind_is_an_error() -> None:
    with pytest.raises(SchemaError, match="unknown document kind"):
        validate({}, "helm-chart")  # type: ignore[arg-type]


def _blob(layout: Path, digest: str) -> Any:
    algorithm, encoded = digest.split(":")
    return json.loads((layout / "blobs" / algorithm / encoded).read_text())


def test_documents_written_by_umoci_and_skopeo_validate(tmp_path: Path) -> None:
    umoci, skopeo = require_binary("umoci"), require_binary("skopeo")
    layout = tmp_path / "layout"

    def run(*command: str) -> None:
        subprocess.run(command, cwd=tmp_path, check=True, timeout=60, capture_output=True)

    run(umoci, "init", "--layout", str(layout))
    run(umoci, "new", "--image", f"{layout}:t")
    (tmp_path / "content" / "etc").mkdir(parents=True)
    (tmp_path / "content" / "etc" / "hello").write_text("hi\n")
    run(umoci, "insert", "--image", f"{layout}:t", str(tmp_path / "content"), "/")
    run(umoci, "config", "--image", f"{layout}:t", "--config.user", "1000:1000",
        "--config.env", "A=1", "--config.cmd", "sh", "--config.label", "k=v",
        "--config.exposedports", "80/tcp", "--config.volume", "/data")
    index = json.loads((layout / "index.json").read_text())
    validate(index, "image-index")
    manifest = _blob(layout, index["manifests"][0]["digest"])
    validate(manifest, "image-manifest")
    validate(_blob(layout, manifest["config"]["digest"]), "image-config")

    docker_dir = tmp_path / "v2s2"
    run(skopeo, "copy", "--format", "v2s2", f"oci:{layout}:t", f"dir:{docker_dir}")
    docker_manifest = json.loads((docker_dir / "manifest.json").read_text())
    validate(docker_manifest, "docker-manifest")
    config_hex = docker_manifest["config"]["digest"].split(":")[1]
    validate(json.loads((docker_dir / config_hex).read_text()), "image-config")

    run(umoci, "unpack", "--rootless", "--image", f"{layout}:t", str(tmp_path / "bundle"))
    validate(json.loads((tmp_path / "bundle" / "config.json").read_text()), "runtime-config")


def test_every_schema_file_is_a_valid_draft_2020_12_schema() -> None:
    from importlib import resources

    from jsonschema import Draft202012Validator

    files = list(resources.files("ocistage.bundler.image").joinpath("schemas").iterdir())
    assert len(files) >= len(KINDS)
    for file in files:
        Draft202012Validator.check_schema(json.loads(file.read_text("utf-8")))
