"""Build OCI images for tests from dicts of files or directories, reproducibly.

:func:`build_image` writes an image into an OCI image layout (``oci:LAYOUT:TAG``): one layer
per item of ``layers``, each a directory or a mapping of path -> entry, compressed as gzip,
zstd or not at all, and one manifest per platform (several platforms make an OCI index).
Everything that could vary between runs is fixed (tar headers: mtime, owner names, PAX
format; gzip: no name, mtime 0; JSON: sorted keys), so the same input gives the same digests
on every run and every machine.

Entries of a mapping (a ``str`` or ``bytes`` value is a regular file with mode 0644)::

    {"app/run.sh": File("#!/bin/sh\\necho hi\\n", mode=0o755),
     "app/data": Dir(mode=0o700, uid=1000, gid=1000),
     "bin/sh": Symlink("busybox"), "app/again.sh": Hardlink("app/run.sh"),
     "etc/motd": WHITEOUT,          # deletes /etc/motd of a lower layer (.wh.motd)
     "var/cache": OPAQUE}           # hides the lower layers' /var/cache contents (.wh..wh..opq)

Parent directories that no layer of the image names yet are added (mode 0755, root). A
directory layer keeps each entry's permission bits and link targets; owners become root (0:0)
so the digest does not depend on who runs the test; hard links stay hard links.

:meth:`BuiltImage.push` copies the image into a registry with ``skopeo copy
--preserve-digests`` (same digest there), :meth:`BuiltImage.write_archive` writes an
``oci-archive:`` file. :func:`busybox_layer` is a small runnable base (Debian's busybox-static).
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pytest_ocistage.components import Registry, require_binary
from pytest_ocistage.fixturelayers import MTIME
from pytest_ocistage.images import (
    LAYER_MEDIA_TYPES,
    MEDIA_CONFIG,
    MEDIA_INDEX,
    MEDIA_MANIFEST,
    REF_NAME,
    ImageRef,
    Json,
    Layout,
    LayoutImage,
    _describe,
    _skopeo,
    host_architecture,
)

CREATED = "2023-11-14T22:13:20Z"  # MTIME as RFC 3339: the config's fixed creation time
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUSYBOX_APPLETS = ("sh", "ls", "cat", "id", "echo", "env", "pwd", "test", "true", "false",
                   "mkdir", "rm", "touch", "sleep", "wc", "head")


@dataclass(frozen=True)
class File:
    """A regular file: ``data`` (text is UTF-8) or the contents of ``source`` (streamed)."""

    data: bytes | str = b""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    source: Path | None = None
    xattrs: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Dir:
    mode: int = 0o755
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class Symlink:
    target: str


@dataclass(frozen=True)
class Hardlink:
    """A hard link to ``target``, a path in this layer or a lower one."""

    target: str


@dataclass(frozen=True)
class Whiteout:
    """Deletes the path (and what is below it) from the lower layers."""


@dataclass(frozen=True)
class Opaque:
    """Keyed by a directory: hides everything the lower layers put in it."""


WHITEOUT = Whiteout()
OPAQUE = Opaque()

Entry = bytes | str | File | Dir | Symlink | Hardlink | Whiteout | Opaque
LayerSource = Mapping[str, Entry] | Path


@dataclass(frozen=True)
class BuiltImage:
    """An image in an OCI layout; ``ref`` is its ``oci:`` reference."""

    layout: Path
    tag: str
    digest: str  # the manifest's, or the index's for several platforms
    media_type: str
    config_digest: str | None  # None for an index
    layer_digests: tuple[str, ...]
    diff_ids: tuple[str, ...]
    platforms: dict[str, str]  # index only: "os/arch[/variant]" -> manifest digest

    @property
    def ref(self) -> str:
        return f"oci:{self.layout}:{self.tag}"

    def push(self, registry: Registry, repository: str, tag: str = "latest") -> ImageRef:
        """Copy the image (every platform) to registry; same digests there (skopeo)."""
        require_binary("skopeo")
        target = f"docker://{registry.host}/{repository}:{tag}"
        with tempfile.TemporaryDirectory(prefix="ocistage-push-") as scratch:
            digest_file = Path(scratch) / "digest"
            _skopeo(["copy", "--quiet", "--preserve-digests",
                     *(["--all"] if self.media_type == MEDIA_INDEX else []),
                     *registry.skopeo_flags("dest-"), "--digestfile", str(digest_file),
                     self.ref, target])
            pushed = digest_file.read_text().strip()
        if pushed != self.digest:
            raise AssertionError(f"{target} has digest {pushed}, the layout {self.digest}")
        layout = Layout(self.layout)
        layer_media_types: tuple[str, ...] = ()
        if self.config_digest is not None:
            manifest = layout.read_json(self.digest)
            layer_media_types = tuple(layer["mediaType"] for layer in manifest["layers"])
        return ImageRef(repository, f"{registry.host}/{repository}:{tag}", registry, repository,
                        tag, self.digest, self.media_type, self.config_digest,
                        self.layer_digests, layer_media_types, self.diff_ids,
                        dict(self.platforms), self.layout, self.tag)

    def write_archive(self, path: Path) -> str:
        """The layout as an ``oci-archive`` tar at path (reproducible); returns its reference."""
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(_walk(self.layout)):
                source = self.layout / name
                info = tar.gettarinfo(str(source), arcname=name)
                _normalise(info)
                if info.isreg():
                    with source.open("rb") as file:
                        tar.addfile(info, file)
                else:
                    tar.addfile(info)
        return f"oci-archive:{path}:{self.tag}"


def _walk(root: Path) -> Iterator[str]:
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            yield os.path.relpath(os.path.join(directory, name), root)


def _normalise(info: tarfile.TarInfo) -> None:
    info.mtime = MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""


def busybox_layer() -> dict[str, Entry]:
    """A base layer that runs: ``/bin/busybox`` (Debian's busybox-static), its common applets
    as symlinks, and ``/etc/passwd``/``group`` with root, ``app`` (1000) and nobody."""
    busybox = Path(require_binary("busybox", "busybox-static")).resolve()
    layer: dict[str, Entry] = {"bin/busybox": File(source=busybox, mode=0o755)}
    layer.update({f"bin/{applet}": Symlink("busybox") for applet in BUSYBOX_APPLETS})
    layer["etc/passwd"] = ("root:x:0:0:root:/root:/bin/sh\n"
                           "app:x:1000:1000:app:/home/app:/bin/sh\n"
                           "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
    layer["etc/group"] = "root:x:0:\napp:x:1000:\nnogroup:x:65534:\n"
    layer["root"] = Dir(0o700)
    layer["tmp"] = Dir(0o1777)
    return layer


# --- layers -----------------------------------------------------------------------------------

def _clean(path: str) -> str:
    pure = PurePosixPath("/", path)
    if ".." in pure.parts:
        raise ValueError(f"a layer path may not contain '..': {path!r}")
    return str(pure.relative_to("/"))


def _parents(path: str) -> Iterator[str]:
    parts = PurePosixPath(path).parts
    for end in range(1, len(parts)):
        yield str(PurePosixPath(*parts[:end]))


def _info(name: str, kind: bytes, mode: int, uid: int = 0, gid: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    _normalise(info)
    info.uid, info.gid = uid, gid
    return info


def _add_entry(tar: tarfile.TarFile, name: str, entry: Entry) -> None:
    if isinstance(entry, (bytes, str)):
        entry = File(entry)
    if isinstance(entry, File):
        info = _info(name, tarfile.REGTYPE, entry.mode, entry.uid, entry.gid)
        if entry.xattrs:
            info.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in entry.xattrs.items()}
        if entry.source is not None:
            info.size = entry.source.stat().st_size
            with entry.source.open("rb") as file:
                tar.addfile(info, file)
            return
        data = entry.data.encode() if isinstance(entry.data, str) else entry.data
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    elif isinstance(entry, Dir):
        tar.addfile(_info(name + "/", tarfile.DIRTYPE, entry.mode, entry.uid, entry.gid))
    elif isinstance(entry, Symlink):
        info = _info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = entry.target
        tar.addfile(info)
    elif isinstance(entry, Hardlink):
        info = _info(name, tarfile.LNKTYPE, 0o644)
        info.linkname = _clean(entry.target)
        tar.addfile(info)
    elif isinstance(entry, Whiteout):
        path = PurePosixPath(name)
        tar.addfile(_info(str(path.with_name(f".wh.{path.name}")), tarfile.REGTYPE, 0o644))
    else:
        tar.addfile(_info(f"{name}/.wh..wh..opq", tarfile.REGTYPE, 0o644))


def _mapping_entries(files: Mapping[str, Entry]) -> dict[str, Entry]:
    return {_clean(path): entry for path, entry in files.items()}


def _directory_entries(root: Path) -> dict[str, Entry]:
    """A directory tree as entries: permission bits and link targets kept, owners root."""
    entries: dict[str, Entry] = {}
    first_link: dict[tuple[int, int], str] = {}
    for name in sorted(_walk(root)):
        path = root / name
        st = path.lstat()
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            entries[name] = Dir(mode)
        elif stat.S_ISLNK(st.st_mode):
            entries[name] = Symlink(os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 and key in first_link:
                entries[name] = Hardlink(first_link[key])
            else:
                first_link[key] = name
                entries[name] = File(mode=mode, source=path)
        else:
            raise ValueError(f"{path}: only directories, files and symlinks go into a layer")
    return entries


def _write_layer_tar(path: Path, entries: Mapping[str, Entry], known: set[str]) -> None:
    """One tar layer, parents first; adds the parent directories no layer has named yet."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        wanted = dict(entries)
        for name in entries:
            for parent in _parents(name):
                if parent not in known and parent not in wanted:
                    wanted[parent] = Dir()
        for name in sorted(wanted, key=lambda n: PurePosixPath(n).parts):
            entry = wanted[name]
            _add_entry(tar, name, entry)
            if isinstance(entry, Whiteout):
                known.discard(name)
            elif not isinstance(entry, Opaque):
                known.add(name)


# --- the image --------------------------------------------------------------------------------

def _platform(spec: str) -> dict[str, str]:
    parts = spec.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"a platform is os/arch[/variant], not {spec!r}")
    platform = {"os": parts[0], "architecture": parts[1]}
    if len(parts) == 3:
        platform["variant"] = parts[2]
    return platform


def _dump(layout: Layout, document: Json, media_type: str) -> Json:
    """Write a JSON blob with sorted keys (reproducible bytes); returns its descriptor."""
    canonical = json.loads(json.dumps(document, sort_keys=True))
    return layout.write_json(canonical, media_type)


def _init_layout(path: Path) -> Layout:
    (path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    if not (path / "oci-layout").exists():
        (path / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    if not (path / "index.json").exists():
        (path / "index.json").write_text(
            json.dumps({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": []}))
    return Layout(path)


def build_image(layout_path: Path, layers: Sequence[LayerSource], *, tag: str = "latest",
                entrypoint: Sequence[str] | None = None, cmd: Sequence[str] | None = None,
                env: Mapping[str, str] | Iterable[str] | None = None,
                user: str | None = None, workdir: str | None = None,
                labels: Mapping[str, str] | None = None, compression: str = "gzip",
                platforms: Sequence[str] | None = None) -> BuiltImage:
    """Build an image into the OCI layout at layout_path (made if missing) as ``tag``.

    ``env``: a mapping or ``NAME=value`` strings; a ``PATH`` is added unless given.
    ``platforms``: ``os/arch[/variant]`` strings, default this host's linux platform; more
    than one makes an index whose manifests share the layers.
    """
    if compression not in LAYER_MEDIA_TYPES:
        raise ValueError(f"compression must be one of {', '.join(LAYER_MEDIA_TYPES)}")
    layout = _init_layout(layout_path)
    descriptors, diff_ids = _write_layers(layout, layers, compression)
    container = _container_config(
        _env_list(env), ("Entrypoint", list(entrypoint) if entrypoint is not None else None),
        ("Cmd", list(cmd) if cmd is not None else None), ("User", user),
        ("WorkingDir", workdir), ("Labels", dict(labels) if labels else None))
    manifests = [_platform_manifest(layout, _platform(spec), container, descriptors, diff_ids)
                 for spec in platforms or [f"linux/{host_architecture()}"]]
    layout.set_tag(tag, _top(layout, manifests))
    described: LayoutImage = _describe(layout, tag)
    return BuiltImage(layout_path, tag, described.digest, described.media_type,
                      described.config_digest, described.layer_digests, described.diff_ids,
                      described.platforms)


def _write_layers(layout: Layout, layers: Sequence[LayerSource],
                  compression: str) -> tuple[list[Json], list[str]]:
    """Each layer written as a tar (parents it lacks added, :func:`_write_layer_tar`) and
    added to ``layout``; their descriptors and diff ids."""
    descriptors, diff_ids = [], []
    known: set[str] = set()
    with tempfile.TemporaryDirectory(prefix=".layers-", dir=layout.path) as scratch:
        for number, source in enumerate(layers):
            entries = (_directory_entries(source) if isinstance(source, Path)
                       else _mapping_entries(source))
            tar_path = Path(scratch) / f"layer-{number}.tar"
            _write_layer_tar(tar_path, entries, known)
            descriptor, diff_id = layout.add_tar_layer(tar_path, compression)
            descriptors.append(descriptor)
            diff_ids.append(diff_id)
    return descriptors, diff_ids


def _env_list(env: Mapping[str, str] | Iterable[str] | None) -> list[str]:
    """``NAME=value`` strings, :data:`DEFAULT_PATH` first unless a ``PATH`` is given."""
    env_list = [f"{k}={v}" for k, v in env.items()] if isinstance(env, Mapping) else list(env or ())
    if not any(item.startswith("PATH=") for item in env_list):
        env_list.insert(0, DEFAULT_PATH)
    return env_list


def _container_config(env_list: list[str], *fields: tuple[str, object]) -> Json:
    """The image config's ``config``: ``Env`` and every field whose value is not None."""
    container: Json = {"Env": env_list}
    for key, value in fields:
        if value is not None:
            container[key] = value
    return container


def _platform_manifest(layout: Layout, platform: dict[str, str], container: Json,
                       descriptors: list[Json], diff_ids: list[str]) -> Json:
    """The config and manifest of one platform written; the manifest's descriptor with its
    ``platform``."""
    config: Json = {**platform, "created": CREATED, "config": container,
                    "rootfs": {"type": "layers", "diff_ids": diff_ids},
                    "history": [{"created": CREATED, "created_by": f"layer {n}"}
                                for n in range(len(descriptors))]}
    manifest: Json = {"schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
                      "config": _dump(layout, config, MEDIA_CONFIG), "layers": descriptors}
    return {**_dump(layout, manifest, MEDIA_MANIFEST), "platform": platform}


def _top(layout: Layout, manifests: list[Json]) -> Json:
    """What the tag names: the one manifest, or an index of several (written)."""
    if len(manifests) == 1:
        return {k: v for k, v in manifests[0].items() if k != "platform"}
    return _dump(layout, {"schemaVersion": 2, "mediaType": MEDIA_INDEX,
                          "manifests": manifests}, MEDIA_INDEX)


__all__ = ["CREATED", "DEFAULT_PATH", "OPAQUE", "REF_NAME", "WHITEOUT", "BuiltImage", "Dir",
           "Entry", "File", "Hardlink", "LayerSource", "Opaque", "Symlink", "Whiteout",
           "build_image", "busybox_layer"]
