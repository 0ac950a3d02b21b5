"""Local image sources (oci:, oci-archive:, docker-archive:) through the real pull and store."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from ocistage.bundler.errors import SourceError
from ocistage.bundler.image.platform import Platform
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.pull import PullOptions, pull
from ocistage.cache.digest import Digest
from ocistage.cache.store import Store
from ocistage.errors import IntegrityError, NotFound
from tests.bundler.tarbuilder import build_tar, file, write_oci_layout

LAYER = build_tar([file("hello.txt", b"hello")])
AMD64 = PullOptions(platform=Platform("linux", "amd64"))


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    write_oci_layout(tmp_path / "layout", [LAYER], tag="v1", kind="gzip")
    return tmp_path / "layout"


def test_oci_layout_by_tag_and_untagged(layout: Path, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    tagged = pull(parse_reference(f"oci:{layout}:v1"), store, AMD64)
    untagged = pull(parse_reference(f"oci:{layout}"), store, AMD64)
    assert tagged.manifest.digest == untagged.manifest.digest
    assert store.has_blob(tagged.layers[0].digest)
    assert untagged.reused_blobs == 2  # config + layer were already there


def test_oci_layout_unknown_tag_lists_the_tags(layout: Path, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="no image tagged 'v2'") as info:
        pull(parse_reference(f"oci:{layout}:v2"), Store.open(tmp_path / "c"), AMD64)
    assert info.value.hint is not None and "v1" in info.value.hint


def test_oci_layout_with_several_images_needs_a_tag(layout: Path, tmp_path: Path) -> None:
    index = json.loads((layout / "index.json").read_text())
    twin = dict(index["manifests"][0], annotations={"org.opencontainers.image.ref.name": "v2"})
    index["manifests"].append(twin)
    (layout / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match="holds 2 images"):
        pull(parse_reference(f"oci:{layout}"), Store.open(tmp_path / "c"), AMD64)


def test_tampered_layout_blob_is_refused(layout: Path, tmp_path: Path) -> None:
    blobs = sorted((layout / "blobs/sha256").iterdir(), key=lambda p: p.stat().st_size)
    layer = blobs[-1]  # the largest blob is the gzip layer
    data = bytearray(layer.read_bytes())
    data[-5] ^= 0xFF
    layer.write_bytes(bytes(data))
    store = Store.open(tmp_path / "c")
    with pytest.raises(IntegrityError):
        pull(parse_reference(f"oci:{layout}:v1"), store, AMD64)
    assert not store.has_blob(Digest("sha256", layer.name))


def test_not_a_layout(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not an OCI image layout"):
        pull(parse_reference(f"oci:{tmp_path}"), Store.open(tmp_path / "c"), AMD64)


def _tar_of_directory(directory: Path, archive: Path) -> None:
    with tarfile.open(archive, "w") as tar:
        for path in sorted(directory.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)


def test_oci_archive(layout: Path, tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    _tar_of_directory(layout, archive)
    store = Store.open(tmp_path / "c")
    direct = pull(parse_reference(f"oci:{layout}:v1"), store, AMD64)
    packed = pull(parse_reference(f"oci-archive:{archive}:v1"), Store.open(tmp_path / "d"),
                  AMD64)
    assert packed.manifest.digest == direct.manifest.digest


def _docker_archive(path: Path, images: dict[str, bytes]) -> None:
    """A `docker save`-style archive with one uncompressed-layer image per RepoTag."""
    entries = []
    with tarfile.open(path, "w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for n, (tag, layer) in enumerate(images.items()):
            diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
            config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                                 "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
            config_name = hashlib.sha256(config).hexdigest() + ".json"
            add(config_name, config)
            add(f"layer{n}/layer.tar", layer)
            entries.append({"Config": config_name, "RepoTags": [tag],
                            "Layers": [f"layer{n}/layer.tar"]})
        add("manifest.json", json.dumps(entries).encode())


def test_docker_archive_single_and_named(tmp_path: Path) -> None:
    other = build_tar([file("other.txt", b"other")])
    archive = tmp_path / "save.tar"
    _docker_archive(archive, {"alice/app:1": LAYER, "busybox:latest": other})
    store = Store.open(tmp_path / "c")
    with pytest.raises(SourceError, match="holds 2 images"):
        pull(parse_reference(f"docker-archive:{archive}"), store, AMD64)
    app = pull(parse_reference(f"docker-archive:{archive}:alice/app:1"), store, AMD64)
    assert app.config.diff_ids[0].hex == hashlib.sha256(LAYER).hexdigest()
    assert store.read_blob(app.layers[0].digest) == LAYER
    busybox = pull(parse_reference(f"docker-archive:{archive}:busybox"), store, AMD64)
    assert store.read_blob(busybox.layers[0].digest) == other
    with pytest.raises(NotFound):
        pull(parse_reference(f"docker-archive:{archive}:nobody/none:1"), store, AMD64)


def test_docker_archive_layer_not_matching_its_diff_id_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "save.tar"
    _docker_archive(archive, {"alice/app:1": LAYER})
    with tarfile.open(archive) as tar:
        members = {m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                   for m in tar.getmembers()}
    members["layer0/layer.tar"] = build_tar([file("hello.txt", b"HELLO")])
    with tarfile.open(archive, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(IntegrityError):
        pull(parse_reference(f"docker-archive:{archive}"), Store.open(tmp_path / "c"), AMD64)


def _layers(count: int) -> list[bytes]:
    """Distinct layers of ~1.5 MiB each (a shared read position mixes them up visibly)."""
    return [build_tar([file(f"data{n}.bin", hashlib.sha256(bytes([n])).digest() * 50_000)])
            for n in range(count)]


def test_archive_blobs_are_read_in_parallel_without_mixing(tmp_path: Path) -> None:
    layers = _layers(8)
    entries = []
    archive = tmp_path / "save.tar"
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    with tarfile.open(archive, "w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add("config.json", config)
        for n, layer in enumerate(layers):
            add(f"layer{n}/layer.tar", layer)
        entries.append({"Config": "config.json", "RepoTags": ["many:1"],
                        "Layers": [f"layer{n}/layer.tar" for n in range(len(layers))]})
        add("manifest.json", json.dumps(entries).encode())
    layout = tmp_path / "layout"
    write_oci_layout(layout, layers, tag="v1", kind="gzip")
    packed = tmp_path / "image.tar"
    _tar_of_directory(layout, packed)
    parallel = PullOptions(platform=Platform("linux", "amd64"), jobs=8)
    for round_ in range(6):
        for kind, ref in (("docker", f"docker-archive:{archive}"),
                          ("oci", f"oci-archive:{packed}:v1")):
            store = Store.open(tmp_path / f"cache-{kind}-{round_}")
            image = pull(parse_reference(ref), store, parallel)
            assert len(image.layers) == 8
            for descriptor in image.layers:
                blob = store.blob_path(descriptor.digest).read_bytes()
                assert hashlib.sha256(blob).hexdigest() == descriptor.digest.hex
