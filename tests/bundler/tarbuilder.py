"""Test helpers: build tar layers and OCI layouts by hand, and snapshot directory trees."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

from tests.owned import read_own_bytes

MTIME = 1_000_000


@dataclass
class Entry:
    name: str
    type: bytes = tarfile.REGTYPE
    data: bytes = b""
    mode: int = 0o644
    linkname: str = ""
    mtime: float = MTIME
    xattrs: dict[str, str] = field(default_factory=dict)
    devmajor: int = 0
    devminor: int = 0
    uid: int = 0
    gid: int = 0
    pax: dict[str, str] = field(default_factory=dict)  # raw PAX records, e.g. {"mtime": "nan"}


def file(name: str, data: bytes = b"", mode: int = 0o644, **kw: object) -> Entry:
    return Entry(name, tarfile.REGTYPE, data, mode, **kw)  # type: ignore[arg-type]


def directory(name: str, mode: int = 0o755, **kw: object) -> Entry:
    return Entry(name, tarfile.DIRTYPE, mode=mode, **kw)  # type: ignore[arg-type]


def symlink(name: str, target: str, **kw: object) -> Entry:
    return Entry(name, tarfile.SYMTYPE, mode=0o777, linkname=target, **kw)  # type: ignore[arg-type]


def hardlink(name: str, target: str, **kw: object) -> Entry:
    return Entry(name, tarfile.LNKTYPE, linkname=target, **kw)  # type: ignore[arg-type]


def fifo(name: str, mode: int = 0o644) -> Entry:
    return Entry(name, tarfile.FIFOTYPE, mode=mode)


def chardev(name: str, major: int = 1, minor: int = 3, mode: int = 0o666) -> Entry:
    return Entry(name, tarfile.CHRTYPE, mode=mode, devmajor=major, devminor=minor)


def blockdev(name: str, major: int = 8, minor: int = 0, mode: int = 0o660) -> Entry:
    return Entry(name, tarfile.BLKTYPE, mode=mode, devmajor=major, devminor=minor)


def whiteout(name: str) -> Entry:
    """The whiteout entry that deletes ``name`` from lower layers."""
    parent, _, base = name.rstrip("/").rpartition("/")
    return file(f"{parent}/.wh.{base}" if parent else f".wh.{base}", b"", 0o644)


def opaque(directory_name: str) -> Entry:
    return file(f"{directory_name.rstrip('/')}/.wh..wh..opq" if directory_name else
                ".wh..wh..opq", b"", 0o644)


def build_tar(entries: list[Entry], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = entry.type
            info.mode = entry.mode
            info.mtime = entry.mtime
            info.uid, info.gid = entry.uid, entry.gid
            info.linkname = entry.linkname
            info.devmajor, info.devminor = entry.devmajor, entry.devminor
            if entry.xattrs:
                info.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in entry.xattrs.items()}
            if entry.pax:
                info.pax_headers = {**info.pax_headers, **entry.pax}
            if entry.type == tarfile.REGTYPE:
                info.size = len(entry.data)
                archive.addfile(info, io.BytesIO(entry.data))
            else:
                archive.addfile(info)
    return buffer.getvalue()


def compress(data: bytes, kind: str) -> bytes:
    if kind == "gzip":
        return gzip.compress(data, mtime=0)
    if kind == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return data


_LAYER_TYPES = {"none": "application/vnd.oci.image.layer.v1.tar",
                "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
                "zstd": "application/vnd.oci.image.layer.v1.tar+zstd"}


def write_oci_layout(path: Path, layers: list[bytes], tag: str = "test",
                     kind: str = "none", container: dict[str, object] | None = None) -> None:
    """An OCI image layout at ``path`` holding one image made of ``layers`` (plain tars);
    ``container`` is the image config's ``config`` (Cmd, Env, Labels, ...)."""
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        hexdigest = hashlib.sha256(data).hexdigest()
        (blobs / hexdigest).write_bytes(data)
        return f"sha256:{hexdigest}"

    diff_ids = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    descriptors = []
    for layer in layers:
        blob = compress(layer, kind)
        descriptors.append({"mediaType": _LAYER_TYPES[kind], "digest": put(blob),
                            "size": len(blob)})
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": container or {},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": put(config), "size": len(config)},
        "layers": descriptors}).encode()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": put(manifest),
        "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": tag}}]}
    (path / "index.json").write_text(json.dumps(index))
    (path / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))


Node = tuple[object, ...]


def snapshot(root: Path, *, mtimes: bool = True, dir_mtimes: bool = True,
             xattrs: bool = True) -> dict[str, Node]:
    """Every entry below ``root`` (not ``root`` itself): type, mode, content, target, ...

    Hardlink groups appear as the sorted list of names sharing an inode (for files with
    more than one link inside the tree).
    """
    nodes: dict[str, Node] = {}
    inodes: dict[int, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            info = full.lstat()
            kind = stat.S_IFMT(info.st_mode)
            mode = stat.S_IMODE(info.st_mode)
            content: object = None
            if stat.S_ISREG(kind):
                content = hashlib.sha256(read_own_bytes(full)).hexdigest()
                if info.st_nlink > 1:
                    inodes.setdefault(info.st_ino, []).append(rel)
            elif stat.S_ISLNK(kind):
                content = os.readlink(full)
                mode = 0
            attrs: object = None
            if xattrs and (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
                attrs = tuple(sorted((k, os.getxattr(full, k, follow_symlinks=False))
                                     for k in os.listxattr(full, follow_symlinks=False)
                                     if k.startswith("user.")))
            mtime: object = None
            if mtimes and (dir_mtimes or not stat.S_ISDIR(kind)):
                mtime = info.st_mtime_ns // 1000  # microseconds: tools differ below
            nodes[rel] = (kind, mode, content, attrs, mtime)
    for names in inodes.values():
        group = tuple(sorted(names))
        for name in names:
            nodes[name] = (*nodes[name], group)
    return nodes


DEFAULT_MOUNT_POINTS = ("proc", "dev", "sys")
"""The mount points of the mounts every bundle's config.json has (ocistage.bundler.rootfsmounts)."""


def add_mount_points(rootfs: Path) -> Path:
    """Give another tool's unpack of an image (umoci's) what ``ocistage bundle`` adds to it, a
    documented difference (docs/layers.md): the default mounts' mount points it lacks, empty
    0755 directories dated 0, the rootfs keeping its times."""
    from ocistage.bundler.rootfsmounts import MOUNT_POINT_TIME_NS

    info = rootfs.stat()
    for name in DEFAULT_MOUNT_POINTS:
        if not os.path.lexists(rootfs / name):
            (rootfs / name).mkdir(0o755)
            os.utime(rootfs / name, ns=(MOUNT_POINT_TIME_NS, MOUNT_POINT_TIME_NS))
    os.utime(rootfs, ns=(info.st_atime_ns, info.st_mtime_ns))
    return rootfs


def with_mount_points(nodes: dict[str, Node]) -> dict[str, Node]:
    """:func:`snapshot` ``nodes`` of an image's tree (a cache snapshot's) with what
    :func:`add_mount_points` adds on disk: what the bundle of that tree holds."""
    from ocistage.bundler.rootfsmounts import MOUNT_POINT_TIME_NS

    made: Node = (stat.S_IFDIR, 0o755, None, (), MOUNT_POINT_TIME_NS // 1000)
    return {name: made for name in DEFAULT_MOUNT_POINTS} | nodes


def owner_readable(nodes: dict[str, Node]) -> dict[str, Node]:
    """:func:`snapshot` ``nodes`` of an image's tree (a writable bundle's) as a tree sharing
    the inodes of the cache's snapshot shows them (a cached bundle, ``--link``): regular files
    their owner may not read have the owner's read bit there (cache/snapshotmodes.py)."""
    return {name: (node[0], int(str(node[1])) | stat.S_IRUSR, *node[2:])
            if node[0] == stat.S_IFREG else node for name, node in nodes.items()}


def full_snapshot(root: Path) -> dict[str, Node]:
    """Like :func:`snapshot` but including ``root`` itself; for canary trees."""
    info = root.lstat()
    nodes = snapshot(root)
    nodes["."] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), None, None,
                  info.st_mtime_ns)
    return nodes
