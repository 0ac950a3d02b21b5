"""Benchmark images, built on the spot from this machine's ``/usr`` and cached.

No network is needed: each layer is a slice of ``/usr`` (sorted walk, many small files and some
big ones, like a distribution image) written with :mod:`tarfile`, compressed with ``gzip -6``
or ``zstd -3`` (the defaults of image builders) and stored in an OCI layout under
``~/.cache/ocistage-bench/`` (``$OCISTAGE_BENCH_CACHE``). ``push`` copies them into a running
``docker-registry`` with ``skopeo``.

Images (uncompressed sizes):

- ``single``   one ~200 MB gzip layer (Debian-like: a few thousand dirs, ~10k files)
- ``multi``    the same ~200 MB as four gzip layers (120 + 40 + 30 + 10 MB), with whiteouts
- ``derived``  ``multi`` plus two new layers (15 + 5 MB): shares its four base layers
- ``zstd``     ``single`` recompressed with zstd
- ``big``      ~1 GB in two gzip layers (700 + 300 MB)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUILDER_VERSION = 3
SOURCE = Path("/usr")
# small files first, as in a distribution image: share (docs, locales, man pages), headers, libs
SOURCE_ORDER = ("share", "include", "lib", "bin", "sbin", "libexec", "local")
MB = 1 << 20
MAX_FILE = 40 * MB  # leave out the odd huge file so slices stay comparable across machines

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
               "zstd": "application/vnd.oci.image.layer.v1.tar+zstd"}
COMPRESSOR = {"gzip": ["gzip", "-6", "-n", "-c"], "zstd": ["zstd", "-3", "-q", "-c", "-T1"]}


@dataclass(frozen=True)
class LayerSpec:
    """A slice of the source tree: entries after skipping ``skip`` bytes, up to ``size`` bytes."""

    skip: int
    size: int
    whiteouts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageSpec:
    name: str
    layers: tuple[LayerSpec, ...]
    compression: str = "gzip"


def _slices(sizes: list[int], start: int = 0) -> tuple[LayerSpec, ...]:
    out, offset = [], start
    for size in sizes:
        out.append(LayerSpec(offset, size))
        offset += size
    return tuple(out)


MULTI = _slices([120 * MB, 40 * MB, 30 * MB, 10 * MB])
MULTI = (*MULTI[:3], LayerSpec(MULTI[3].skip, MULTI[3].size,
                               whiteouts=("usr/share/doc", "usr/include")))
SPECS: dict[str, ImageSpec] = {
    "single": ImageSpec("single", _slices([200 * MB])),
    "multi": ImageSpec("multi", MULTI),
    "derived": ImageSpec("derived", (*MULTI, *_slices([15 * MB, 5 * MB], start=1200 * MB))),
    "zstd": ImageSpec("zstd", _slices([200 * MB]), "zstd"),
    "big": ImageSpec("big", _slices([700 * MB, 300 * MB], start=300 * MB)),
}


@dataclass(frozen=True)
class BuiltImage:
    """An image in the bench layout: what the harness needs to pull and to compute the floor."""

    name: str
    layout: Path
    manifest_digest: str
    layers: tuple[tuple[str, str], ...]  # (blob digest, compression)
    diff_ids: tuple[str, ...]
    entries: int
    uncompressed: int
    compressed: int


def cache_root() -> Path:
    env = os.environ.get("OCISTAGE_BENCH_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "ocistage-bench"


def made_once(tree: Path, fill: Callable[[Path], None]) -> Path:
    """``tree`` as it is, or, the first time, made by ``fill(WORK)`` in ``TREE.tmp`` beside it
    and renamed into place (a run killed half-way leaves no half tree at ``tree``)."""
    if tree.is_dir():
        return tree
    print(f"bench: making {tree} (once)", flush=True)
    work = tree.with_name(tree.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    fill(work)
    work.rename(tree)
    return tree


def _walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Entries under ``root`` in a stable order (:data:`SOURCE_ORDER` first), parents first."""
    for name in SOURCE_ORDER:
        if (root / name).is_dir() and not (root / name).is_symlink():
            yield from _walk_tree(root / name)


def _walk_tree(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            names = sorted(os.listdir(directory), reverse=True)
        except OSError:
            continue
        children = []
        for name in names:
            path = directory / name
            try:
                info = os.lstat(path)
            except OSError:
                continue
            children.append((path, info))
        for path, info in reversed(children):
            if stat.S_ISREG(info.st_mode) and (info.st_size > MAX_FILE
                                                or not os.access(path, os.R_OK)):
                continue
            if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)
                    or stat.S_ISLNK(info.st_mode)):
                continue
            yield path, info
        stack.extend(path for path, info in children if stat.S_ISDIR(info.st_mode))


def _entries_in(spec: LayerSpec) -> Iterator[tuple[Path, os.stat_result]]:
    """The entries of one slice: files once the running size passes ``skip``, with parents."""
    seen = 0
    emitted_dirs: set[Path] = set()
    end = spec.skip + spec.size
    for path, info in _walk(SOURCE):
        size = info.st_size if stat.S_ISREG(info.st_mode) else 0
        if stat.S_ISDIR(info.st_mode):
            continue
        seen += size
        if seen <= spec.skip:
            continue
        if seen > end:
            return
        missing = []
        for parent in path.parents:
            if parent in emitted_dirs or parent == Path("/"):
                break
            missing.append(parent)
        for parent in reversed(missing):
            emitted_dirs.add(parent)
            yield parent, os.lstat(parent)
        yield path, info


def write_layer_tar(spec: LayerSpec, out: io.BufferedWriter) -> tuple[int, int]:
    """Write one uncompressed layer tar; return (entries, uncompressed file bytes)."""
    entries = size = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name in spec.whiteouts:
            parent, base = os.path.split(name)
            info = tarfile.TarInfo(f"{parent}/.wh.{base}")
            info.mtime = 1_700_000_000
            tar.addfile(info)
            entries += 1
        for path, st in _entries_in(spec):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to("/")))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with open(path, "rb") as data:
                    tar.addfile(info, data)
                size += st.st_size
            else:
                tar.addfile(info)
            entries += 1
    return entries, size


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(MB):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


class _Layout:
    def __init__(self, path: Path) -> None:
        self.path = path
        (path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        if not (path / "index.json").exists():
            self._write_index([])

    def blob(self, digest: str) -> Path:
        return self.path / "blobs" / "sha256" / digest.split(":", 1)[1]

    def add_file(self, source: Path) -> tuple[str, int]:
        digest = _sha256(source)
        target = self.blob(digest)
        if not target.exists():
            shutil.move(source, target)
        else:
            source.unlink()
        return digest, target.stat().st_size

    def add_json(self, document: dict[str, Any]) -> tuple[str, int]:
        data = json.dumps(document, sort_keys=True).encode()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blob(digest).write_bytes(data)
        return digest, len(data)

    def _write_index(self, manifests: list[dict[str, Any]]) -> None:
        (self.path / "index.json").write_text(json.dumps(
            {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": manifests}))

    def tag(self, name: str, digest: str, size: int) -> None:
        index = json.loads((self.path / "index.json").read_text())
        manifests = [m for m in index["manifests"]
                     if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != name]
        manifests.append({"mediaType": MEDIA_MANIFEST, "digest": digest, "size": size,
                          "annotations": {"org.opencontainers.image.ref.name": name}})
        self._write_index(manifests)


def _build_layer(layout: _Layout, spec: LayerSpec, compression: str,
                 work: Path) -> tuple[str, str, int, int, int]:
    """(blob digest, diff_id, entries, uncompressed bytes, compressed bytes) of one layer."""
    tar_path = work / "layer.tar"
    with open(tar_path, "wb") as out:
        entries, size = write_layer_tar(spec, out)
    diff_id = _sha256(tar_path)
    packed = work / "layer.packed"
    with open(tar_path, "rb") as source, open(packed, "wb") as target:
        subprocess.run(COMPRESSOR[compression], stdin=source, stdout=target, check=True)
    tar_path.unlink()
    digest, compressed = layout.add_file(packed)
    return digest, diff_id, entries, size, compressed


def add_image(layout: _Layout, name: str, layers: list[tuple[str, str, int]],
              compression: str, *, env_path: str, cmd: str, history: str) -> str:
    """Write the config and manifest of an image whose ``layers`` (digest, diff_id, packed
    size) are in ``layout`` already, and tag it ``name``; returns the manifest digest."""
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Env": [f"PATH={env_path}"], "Cmd": [cmd]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id for _, diff_id, _ in layers]},
        "history": [{"created_by": f"{history} layer {n}"} for n in range(len(layers))],
    }
    config_digest, config_size = layout.add_json(config)
    manifest = {
        "schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": MEDIA_LAYER[compression], "digest": digest, "size": size}
                   for digest, _, size in layers],
    }
    manifest_digest, manifest_size = layout.add_json(manifest)
    layout.tag(name, manifest_digest, manifest_size)
    return manifest_digest


def build_image(layout: _Layout, spec: ImageSpec, work: Path,
                layer_cache: dict[tuple[LayerSpec, str], tuple[str, str, int, int, int]]
                ) -> BuiltImage:
    layers = []
    for layer in spec.layers:
        key = (layer, spec.compression)
        if key not in layer_cache:
            layer_cache[key] = _build_layer(layout, layer, spec.compression, work)
        layers.append(layer_cache[key])
    manifest_digest = add_image(
        layout, spec.name, [(layer[0], layer[1], layer[4]) for layer in layers],
        spec.compression, env_path="/usr/local/bin:/usr/bin:/bin", cmd="/usr/bin/true",
        history=f"ocistage bench {spec.name}")
    return BuiltImage(spec.name, layout.path, manifest_digest,
                      tuple((layer[0], spec.compression) for layer in layers),
                      tuple(layer[1] for layer in layers),
                      sum(layer[2] for layer in layers), sum(layer[3] for layer in layers),
                      sum(layer[4] for layer in layers))


def read_built(described: Path) -> dict[str, BuiltImage]:
    """The images an ``images.json`` describes (none if it is not there yet)."""
    known: dict[str, BuiltImage] = {}
    if described.is_file():
        for name, fields in json.loads(described.read_text()).items():
            fields["layout"] = Path(fields["layout"])
            fields["layers"] = tuple(tuple(layer) for layer in fields["layers"])
            fields["diff_ids"] = tuple(fields["diff_ids"])
            known[name] = BuiltImage(**fields)
    return known


def build_all(names: list[str], root: Path | None = None) -> dict[str, BuiltImage]:
    """The named bench images, built on first use and reused from the cache afterwards."""
    root = root or cache_root()
    directory = root / f"images-v{BUILDER_VERSION}"
    described = directory / "images.json"
    known = read_built(described)
    missing = [name for name in names if name not in known]
    if missing:
        directory.mkdir(parents=True, exist_ok=True)
        layout = _Layout(directory / "layout")
        layer_cache: dict[tuple[LayerSpec, str], tuple[str, str, int, int, int]] = {}
        with tempfile.TemporaryDirectory(dir=directory) as work:
            for name in missing:
                print(f"bench: building image {name!r} from {SOURCE} (once; cached in "
                      f"{directory})", flush=True)
                known[name] = build_image(layout, SPECS[name], Path(work), layer_cache)
        serial = {name: {**vars(image), "layout": str(image.layout)}
                  for name, image in known.items()}
        described.write_text(json.dumps(serial, indent=2))
    return {name: known[name] for name in names}


def push(image: BuiltImage, registry_host: str) -> str:
    """Copy the image into the registry (skopeo skips blobs it has); return its reference."""
    ref = f"{registry_host}/bench/{image.name}:latest"
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                    f"oci:{image.layout}:{image.name}", f"docker://{ref}"],
                   check=True, stdin=subprocess.DEVNULL)
    return ref
