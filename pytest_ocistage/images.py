"""The project's fixture images for end-to-end tests, built once and cached between sessions.

Everything lives in one OCI image layout under
``${OCISTAGE_TEST_CACHE:-~/.cache/ocistage-tests}/images-<key>/layout``, where the key combines
:data:`BUILDER_VERSION` with the hash of the busybox binary (changing this builder or Debian's
busybox rebuilds). A build happens in a temp directory that is renamed into place, so a crash
never leaves a half-built cache and concurrent sessions do not collide. Tests must treat the
layout as read-only (copy it with :func:`shutil.copytree` to mutate).

Tags in the layout:

- ``busybox``: the base layer made with ``umoci`` (``/bin/busybox`` + applet symlinks,
  ``/etc/passwd``/``group`` with ``root`` and ``app`` (uid 1000), ``/etc/os-release``) plus a
  hand-made layer with ``/home/app`` owned by 1000; config with Entrypoint, Cmd, Env,
  WorkingDir, User ``app``, Labels and a Volume (set with ``umoci config``).
- ``multilayer``: busybox plus three hand-written tar layers exercising whiteouts, an opaque
  directory (marker after a sibling entry), dir->file and file->symlink type changes, hardlinks
  (within a layer and to a lower layer's file), a PAX long name, a ``user.*`` xattr, a FIFO,
  setuid/setgid files, a mode-000 file, a read-only directory written into by a later layer and
  a symlink whose target points outside the rootfs (legal data, kept verbatim).
- ``busybox-zstd``, ``multilayer-zstd``: the same images with every layer recompressed as
  ``tar+zstd`` here (skopeo 1.9's ``--dest-compress-format zstd`` silently reuses gzip blobs the
  registry already has, so the zstd forms are made by hand and pushed as they are). Debian's
  umoci 0.4.7 cannot unpack zstd layers: compare against the gzip form (same diff_ids).
- ``multiarch``: an OCI index with linux/amd64 and linux/arm64/v8 manifests that share the
  busybox layers (only the config's architecture differs).

``busybox`` and ``multilayer`` also exist as ``oci-archive`` and ``docker-archive`` files
(made with ``skopeo copy``) beside the layout: see :class:`FixtureLayouts`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import zstandard

from pytest_ocistage.components import Registry
from pytest_ocistage.fixturelayers import (
    write_app_home_layer,
    write_multilayer_lower,
    write_multilayer_top,
    write_multilayer_upper,
)

BUILDER_VERSION = "3"
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ls", "cat", "id", "echo", "env", "pwd", "stat", "test", "true", "false",
           "mkdir", "rm", "touch", "sleep", "readlink", "wc", "head")
TAGS = ("busybox", "busybox-zstd", "multilayer", "multilayer-zstd", "multiarch")
ARCHIVED_TAGS = ("busybox", "multilayer")

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
MEDIA_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
LAYER_MEDIA_TYPES = {"gzip": MEDIA_LAYER_GZIP, "zstd": MEDIA_LAYER_ZSTD, "none": MEDIA_LAYER_TAR}
REF_NAME = "org.opencontainers.image.ref.name"

OS_RELEASE_NAME = "ocistage test busybox"
Json = dict[str, Any]


class BuildError(RuntimeError):
    """A fixture image could not be built (a tool failed or the layout is inconsistent)."""


def cache_root() -> Path:
    configured = os.environ.get("OCISTAGE_TEST_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "ocistage-tests"


def host_architecture() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)


def _sha256_file(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


def _run(argv: list[str]) -> None:
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    except subprocess.CalledProcessError as exc:
        raise BuildError(f"{' '.join(argv)} failed:\n{exc.stderr}") from exc


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts what passes through to the real file."""

    def __init__(self, target: BinaryIO) -> None:
        self.target = target
        self.hasher = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hasher.update(view)
        self.size += len(view)
        self.target.write(view)
        return len(view)


@contextmanager
def _compressor(target: _HashingWriter, compression: str) -> Iterator[IO[bytes]]:
    """A writable stream compressing into target (gzip without a name or time: reproducible)."""
    if compression == "gzip":
        with gzip.GzipFile(fileobj=target, mode="wb", mtime=0) as gz:
            yield cast(IO[bytes], gz)
    elif compression == "zstd":
        with zstandard.ZstdCompressor(level=3).stream_writer(
                cast(IO[bytes], target), closefd=False) as zst:
            yield cast(IO[bytes], zst)
    else:
        yield cast(IO[bytes], target)


class Layout:
    """Write access to an OCI image layout, enough to assemble images by hand."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def blob_path(self, digest: str) -> Path:
        algorithm, _, hexpart = digest.partition(":")
        return self.path / "blobs" / algorithm / hexpart

    def read_json(self, digest: str) -> Json:
        data: Json = json.loads(self.blob_path(digest).read_bytes())
        return data

    def write_json(self, document: Json, media_type: str) -> Json:
        data = json.dumps(document, separators=(",", ":")).encode()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        path = self.blob_path(digest)
        if not path.exists():
            path.write_bytes(data)
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def add_tar_layer(self, tar_path: Path, compression: str = "gzip") -> tuple[Json, str]:
        """Compress a tar file (gzip, zstd or none) into a blob, streaming; returns
        (descriptor, diff_id). The same tar gives the same blob, run after run."""
        if compression not in LAYER_MEDIA_TYPES:
            raise ValueError(f"compression must be one of {', '.join(LAYER_MEDIA_TYPES)}, "
                             f"not {compression!r}")
        tmp = self.path / "blobs" / "sha256" / ".incoming"
        diff = hashlib.sha256()
        with tmp.open("wb") as out, tar_path.open("rb") as src:
            writer = _HashingWriter(out)
            with _compressor(writer, compression) as sink:
                while chunk := src.read(1 << 20):
                    diff.update(chunk)
                    sink.write(chunk)
        digest = "sha256:" + writer.hasher.hexdigest()
        tmp.rename(self.blob_path(digest))
        descriptor = {"mediaType": LAYER_MEDIA_TYPES[compression], "digest": digest,
                      "size": writer.size}
        return descriptor, "sha256:" + diff.hexdigest()

    def add_zstd_layer(self, gzip_descriptor: Json) -> Json:
        """Recompress a gzip layer blob as zstd (same diff_id), streaming."""
        tmp = self.path / "blobs" / "sha256" / ".incoming"
        with tmp.open("wb") as out, gzip.open(self.blob_path(gzip_descriptor["digest"])) as src:
            writer = _HashingWriter(out)
            with _compressor(writer, "zstd") as zst:
                while chunk := src.read(1 << 20):
                    zst.write(chunk)
        digest = "sha256:" + writer.hasher.hexdigest()
        tmp.rename(self.blob_path(digest))
        return {"mediaType": MEDIA_LAYER_ZSTD, "digest": digest, "size": writer.size}

    def recompress_zstd(self, source_tag: str, new_tag: str) -> Json:
        """A new image new_tag: source_tag's image with every layer as tar+zstd."""
        manifest = self.read_json(self.resolve(source_tag)["digest"])
        manifest["layers"] = [self.add_zstd_layer(layer) for layer in manifest["layers"]]
        descriptor = self.write_json(manifest, MEDIA_MANIFEST)
        self.set_tag(new_tag, descriptor)
        return descriptor

    def index(self) -> Json:
        data: Json = json.loads((self.path / "index.json").read_text())
        return data

    def resolve(self, tag: str) -> Json:
        for descriptor in self.index()["manifests"]:
            if descriptor.get("annotations", {}).get(REF_NAME) == tag:
                return dict(descriptor)
        raise BuildError(f"tag {tag!r} not in {self.path}")

    def set_tag(self, tag: str, descriptor: Json) -> None:
        index = self.index()
        kept = [d for d in index["manifests"] if d.get("annotations", {}).get(REF_NAME) != tag]
        tagged = dict(descriptor)
        tagged["annotations"] = {**descriptor.get("annotations", {}), REF_NAME: tag}
        index["manifests"] = [*kept, tagged]
        tmp = self.path / "index.json.tmp"
        tmp.write_text(json.dumps(index, separators=(",", ":")))
        tmp.replace(self.path / "index.json")

    def append_layers(self, source_tag: str, new_tag: str, layers: Iterable[Path],
                      edit_config: Callable[[Json], None] | None = None) -> Json:
        """A new image new_tag = source_tag's image + layers (+ config edits)."""
        manifest = self.read_json(self.resolve(source_tag)["digest"])
        config = self.read_json(manifest["config"]["digest"])
        for tar_path in layers:
            descriptor, diff_id = self.add_tar_layer(tar_path)
            manifest["layers"].append(descriptor)
            config["rootfs"]["diff_ids"].append(diff_id)
            if "history" in config:
                config["history"].append({"created": "2023-11-14T22:13:20Z",
                                          "created_by": f"ocistage test layer {tar_path.name}"})
        if edit_config is not None:
            edit_config(config)
        manifest["config"] = self.write_json(config, MEDIA_CONFIG)
        descriptor = self.write_json(manifest, MEDIA_MANIFEST)
        self.set_tag(new_tag, descriptor)
        return descriptor


# --- the build --------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayoutImage:
    """One tag of the fixture layout, as recorded when it was built."""

    tag: str
    digest: str
    media_type: str
    config_digest: str | None
    layer_digests: tuple[str, ...]
    diff_ids: tuple[str, ...]
    platforms: dict[str, str]  # index only: "os/arch[/variant]" -> manifest digest


@dataclass(frozen=True)
class FixtureLayouts:
    layout: Path
    images: dict[str, LayoutImage]

    def oci_ref(self, tag: str) -> str:
        return f"oci:{self.layout}:{tag}"

    def oci_archive(self, tag: str) -> Path:
        """``tag`` as an oci-archive (a tar of an OCI layout holding ``tag``)."""
        return self.layout.parent / "archives" / f"{tag}.oci.tar"

    def oci_archive_ref(self, tag: str) -> str:
        return f"oci-archive:{self.oci_archive(tag)}:{tag}"

    def docker_archive(self, tag: str) -> Path:
        """``tag`` as ``docker save`` output, tagged ``ocistage-test/<tag>:latest``."""
        return self.layout.parent / "archives" / f"{tag}.docker.tar"

    def docker_archive_ref(self, tag: str) -> str:
        return f"docker-archive:{self.docker_archive(tag)}"


def _populate_busybox_rootfs(rootfs: Path) -> None:
    (rootfs / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
    (rootfs / "bin" / "busybox").chmod(0o755)
    for applet in APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    etc = rootfs / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                "app:x:1000:1000:app user:/home/app:/bin/sh\n"
                                "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
    (etc / "group").write_text("root:x:0:\napp:x:1000:\nnogroup:x:65534:\n")
    (etc / "os-release").write_text(f'NAME="{OS_RELEASE_NAME}"\nID=ocistage-test\n'
                                    f'VERSION_ID="{BUILDER_VERSION}"\n')
    (rootfs / "root").mkdir(mode=0o700, exist_ok=True)


def _describe(layout: Layout, tag: str) -> LayoutImage:
    descriptor = layout.resolve(tag)
    document = layout.read_json(descriptor["digest"])
    if descriptor["mediaType"] == MEDIA_INDEX:
        platforms = {}
        for entry in document["manifests"]:
            plat = entry["platform"]
            key = "/".join(p for p in (plat["os"], plat["architecture"], plat.get("variant")) if p)
            platforms[key] = entry["digest"]
        return LayoutImage(tag, descriptor["digest"], MEDIA_INDEX, None, (), (), platforms)
    config = layout.read_json(document["config"]["digest"])
    return LayoutImage(tag, descriptor["digest"], descriptor["mediaType"],
                       document["config"]["digest"],
                       tuple(layer["digest"] for layer in document["layers"]),
                       tuple(config["rootfs"]["diff_ids"]), {})


def _build_multiarch(layout: Layout) -> None:
    amd64 = layout.resolve("busybox")
    manifest = layout.read_json(amd64["digest"])
    config = layout.read_json(manifest["config"]["digest"])
    entries = []
    for arch, variant in (("amd64", None), ("arm64", "v8")):
        config["architecture"] = arch
        config.pop("variant", None)
        if variant is not None:
            config["variant"] = variant
        manifest["config"] = layout.write_json(config, MEDIA_CONFIG)
        descriptor = layout.write_json(manifest, MEDIA_MANIFEST)
        plat = {"architecture": arch, "os": "linux"}
        if variant is not None:
            plat["variant"] = variant
        entries.append({**descriptor, "platform": plat})
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": entries}
    layout.set_tag("multiarch", layout.write_json(index, MEDIA_INDEX))


def build_layout(workdir: Path) -> FixtureLayouts:
    """Build every fixture image into workdir/layout (no caching here)."""
    path = workdir / "layout"
    _run(["umoci", "init", "--layout", str(path)])
    _run(["umoci", "new", "--image", f"{path}:busybox"])
    bundle = workdir / "bundle"
    _run(["umoci", "unpack", "--rootless", "--image", f"{path}:busybox", str(bundle)])
    _populate_busybox_rootfs(bundle / "rootfs")
    _run(["umoci", "repack", "--image", f"{path}:busybox", str(bundle)])
    _run(["umoci", "config", "--image", f"{path}:busybox",
          "--architecture", host_architecture(), "--os", "linux",
          "--config.entrypoint", "/bin/sh", "--config.entrypoint", "-c",
          "--config.cmd", "echo hello from busybox",
          "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin",
          "--config.env", "GREETING=hello world",
          "--config.env", "OCISTAGE_FIXTURE=busybox",
          "--config.workingdir", "/home/app", "--config.user", "app",
          "--config.label", "org.opencontainers.image.title=ocistage busybox fixture",
          "--config.label", "io.ocistage.test.fixture=busybox",
          "--config.volume", "/var/cache/app",
          "--history.created_by", "ocistage test fixture config"])
    layout = Layout(path)
    layers = workdir / "layers"
    layers.mkdir()
    write_app_home_layer(layers / "app-home.tar")
    layout.append_layers("busybox", "busybox", [layers / "app-home.tar"])

    def multilayer_config(config: Json) -> None:
        config["config"]["Labels"]["io.ocistage.test.fixture"] = "multilayer"
        config["config"]["Env"] = [e for e in config["config"]["Env"]
                                   if not e.startswith("OCISTAGE_FIXTURE=")]
        config["config"]["Env"].append("OCISTAGE_FIXTURE=multilayer")
        config["config"]["Cmd"] = ["ls -la /data"]

    write_multilayer_lower(layers / "lower.tar")
    write_multilayer_upper(layers / "upper.tar")
    write_multilayer_top(layers / "top.tar")
    layout.append_layers("busybox", "multilayer",
                         [layers / "lower.tar", layers / "upper.tar", layers / "top.tar"],
                         multilayer_config)
    _build_multiarch(layout)
    layout.recompress_zstd("busybox", "busybox-zstd")
    layout.recompress_zstd("multilayer", "multilayer-zstd")
    _run(["umoci", "gc", "--layout", str(path)])
    shutil.rmtree(bundle)
    shutil.rmtree(layers)
    images = {tag: _describe(layout, tag) for tag in TAGS}
    fixtures = FixtureLayouts(path, images)
    fixtures.oci_archive("busybox").parent.mkdir()
    for tag in ARCHIVED_TAGS:
        _skopeo(["copy", "--quiet", fixtures.oci_ref(tag), fixtures.oci_archive_ref(tag)])
        _skopeo(["copy", "--quiet", fixtures.oci_ref(tag),
                 f"{fixtures.docker_archive_ref(tag)}:ocistage-test/{tag}:latest"])
    return fixtures


def _save(fixtures: FixtureLayouts, file: Path) -> None:
    file.write_text(json.dumps({tag: vars(image) for tag, image in fixtures.images.items()}))


def _load(directory: Path) -> FixtureLayouts:
    data = json.loads((directory / "fixtures.json").read_text())
    images = {}
    for tag, fields in data.items():
        fields["layer_digests"] = tuple(fields["layer_digests"])
        fields["diff_ids"] = tuple(fields["diff_ids"])
        images[tag] = LayoutImage(**fields)
    return FixtureLayouts(directory / "layout", images)


def cache_key() -> str:
    return f"images-v{BUILDER_VERSION}-{_sha256_file(BUSYBOX)[:12]}"


def fixture_layouts(root: Path | None = None) -> FixtureLayouts:
    """The fixture layouts, built on first use and reused from the cache afterwards."""
    root = root if root is not None else cache_root()
    final = root / cache_key()
    if (final / "fixtures.json").is_file():
        return _load(final)
    root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        fixtures = build_layout(workdir)
        _save(fixtures, workdir / "fixtures.json")
        workdir.chmod(0o755)  # mkdtemp made it private; other users' tests read it too
        try:
            workdir.rename(final)
        except OSError:
            if not (final / "fixtures.json").is_file():  # lost a race against a complete build
                raise
    finally:
        if workdir.exists():
            shutil.rmtree(workdir)
    return _load(final)


# --- pushing into registries ------------------------------------------------------------------

@dataclass(frozen=True)
class PushSpec:
    """Push layout tag ``source`` to ``repository:tag`` with extra ``skopeo copy`` flags."""

    name: str
    source: str
    registry: Registry
    repository: str
    tag: str = "latest"
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageRef:
    """A fixture image as served by a registry, with what a correct pull must produce."""

    name: str
    ref: str  # "127.0.0.1:PORT/repo:tag"
    registry: Registry
    repository: str
    tag: str
    digest: str  # manifest (or index) digest as the registry serves it
    media_type: str
    config_digest: str | None  # None for an index
    layer_digests: tuple[str, ...]
    layer_media_types: tuple[str, ...]
    diff_ids: tuple[str, ...]
    platforms: dict[str, str]  # index only: "os/arch[/variant]" -> manifest digest
    layout: Path  # the source OCI layout (read-only)
    layout_tag: str

    @property
    def by_digest(self) -> str:
        return f"{self.registry.host}/{self.repository}@{self.digest}"

    @property
    def oci_ref(self) -> str:
        return f"oci:{self.layout}:{self.layout_tag}"

    def via(self, host: str) -> str:
        """The same reference through another host, e.g. a fault proxy's "127.0.0.1:PORT"."""
        return f"{host}/{self.repository}:{self.tag}"


def _skopeo(argv: list[str]) -> str:
    try:
        result = subprocess.run(["skopeo", *argv], check=True, capture_output=True, text=True,
                                timeout=300, stdin=subprocess.DEVNULL)
    except subprocess.CalledProcessError as exc:
        raise BuildError(f"skopeo {' '.join(argv)} failed:\n{exc.stderr}") from exc
    return result.stdout


def push(spec: PushSpec, fixtures: FixtureLayouts, scratch: Path) -> ImageRef:
    """skopeo copy one layout tag into a registry and describe what the registry now serves."""
    reg = spec.registry
    target = f"docker://{reg.host}/{spec.repository}:{spec.tag}"
    digest_file = scratch / f"{spec.name.replace('/', '_')}.digest"
    multi = fixtures.images[spec.source].media_type == MEDIA_INDEX
    _skopeo(["copy", "--quiet", *(["--all"] if multi else []), *reg.skopeo_flags("dest-"),
             "--digestfile", str(digest_file), *spec.flags, fixtures.oci_ref(spec.source), target])
    digest = digest_file.read_text().strip()
    raw = json.loads(_skopeo(["inspect", "--raw", *reg.skopeo_flags(), target]))
    media_type = raw.get("mediaType", MEDIA_MANIFEST)
    layout_tag = spec.source
    if "manifests" in raw:
        platforms = {}
        for entry in raw["manifests"]:
            plat = entry["platform"]
            key = "/".join(p for p in (plat["os"], plat["architecture"], plat.get("variant")) if p)
            platforms[key] = entry["digest"]
        return ImageRef(spec.name, f"{reg.host}/{spec.repository}:{spec.tag}", reg,
                        spec.repository, spec.tag, digest, media_type, None, (), (), (),
                        platforms, fixtures.layout, layout_tag)
    config = json.loads(_skopeo(["inspect", "--config", "--raw", *reg.skopeo_flags(), target]))
    return ImageRef(spec.name, f"{reg.host}/{spec.repository}:{spec.tag}", reg, spec.repository,
                    spec.tag, digest, media_type, raw["config"]["digest"],
                    tuple(layer["digest"] for layer in raw["layers"]),
                    tuple(layer["mediaType"] for layer in raw["layers"]),
                    tuple(config["rootfs"]["diff_ids"]), {}, fixtures.layout, layout_tag)


def push_all(specs: Iterable[PushSpec], fixtures: FixtureLayouts, scratch: Path,
             jobs: int = 4) -> dict[str, ImageRef]:
    """Push every spec: different repositories in parallel, one repository's pushes in turn.

    distribution's filesystem storage answers 500 ("failed to read from destination
    repository") when two uploads of the same blob into one repository overlap.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, str], list[PushSpec]] = {}
    for spec in specs:
        groups.setdefault((spec.registry.host, spec.repository), []).append(spec)

    def push_group(group: list[PushSpec]) -> list[ImageRef]:
        return [push(spec, fixtures, scratch) for spec in group]

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(push_group, groups.values()))
    return {ref.name: ref for refs in results for ref in refs}
