"""Bundles as files at any fsspec URL: squashfs images and tar archives, pushed and fetched.

``ocistage stage BUNDLE --to URL`` (``file://``, ``memory://``, ``sftp://``, ``s3://`` with the
matching fsspec extra installed) writes ``URL/NAME.sqfs`` (``--format squashfs``) or
``URL/NAME.tar`` (``--format dir``: an uncompressed tar of the tree, for tools that want one).
``ocistage stage URL/NAME.sqfs --to DIR`` fetches an image and mounts or unpacks it in DIR like
a locally built one.

Uploads stream in chunks to ``NAME.<random>.partial`` and are then moved to their name, so a
reader never sees half a file where the filesystem's ``mv`` is a rename (file, sftp, memory);
on object stores the upload itself is atomic. Nothing is read whole into memory.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ocistage.cache.dirfds import DIR_FOLLOW
from ocistage.cache.leases import Holder, Lease
from ocistage.cache.targetlayout import IMAGE_SUFFIX, image_path, outer_marker_name
from ocistage.cache.treeremoval import remove_tree
from ocistage.stagers.errors import StageError
from ocistage.stagers.filemanifest import MANIFEST_NAME, fill_hashes, load_manifest, scan
from ocistage.stagers.markers import Marker, write_at
from ocistage.stagers.squashfs import install_image, make_image, tree_size
from ocistage.stagers.target import StageResult, check_name
from ocistage.stagers.transaction import Staging

if TYPE_CHECKING:
    from ocistage.results import Renderer

CHUNK = 4 << 20
TAR_SUFFIX = ".tar"


@dataclass(frozen=True)
class PushResult:
    url: str
    format: str
    size: int

    def to_json(self) -> dict[str, Any]:
        """What ``stage --json`` prints for a bundle stored at a URL."""
        return {"url": self.url, "format": self.format, "size": self.size}

    def render(self, out: Renderer) -> None:
        out.line(self.url)


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec  # imported when a URL is used: it costs ~40 ms at every CLI start

        return fsspec.core.url_to_fs(url)  # type: ignore[no-any-return]
    except (ImportError, ValueError) as exc:
        raise StageError(f"cannot use {url}: {exc}",
                         "install the fsspec extra for this protocol (e.g. s3fs, paramiko)") \
            from exc


def join(url: str, name: str) -> str:
    return url.rstrip("/") + "/" + name


def _copy_stream(src: BinaryIO, dst: BinaryIO) -> int:
    total = 0
    while chunk := src.read(CHUNK):
        dst.write(chunk)
        total += len(chunk)
    return total


@contextlib.contextmanager
def _uploading(url: str) -> Iterator[tuple[Any, str]]:
    """(filesystem, partial path) to write ``url``'s content to; moved into place at the end.

    The parent is made first; on an error the partial file is removed and a StageError raised.
    """
    fs, path = _filesystem(url)
    partial = f"{path}.{uuid.uuid4().hex[:10]}.partial"
    try:
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if parent:
            fs.makedirs(parent, exist_ok=True)
        yield fs, partial
        fs.mv(partial, path)
    except OSError as exc:
        with contextlib.suppress(Exception):
            fs.rm(partial)
        raise StageError(f"uploading to {url} failed: {exc}") from exc


def push_file(local: Path, url: str) -> int:
    """Upload ``local`` to ``url`` (streamed, then moved into place); returns the size."""
    with _uploading(url) as (fs, partial), open(local, "rb") as src, \
            fs.open(partial, "wb") as dst:
        return _copy_stream(src, dst)


def fetch_file(url: str, dest: Path) -> int:
    """Download ``url`` to ``dest`` (through a temp file beside it); returns the size."""
    fs, path = _filesystem(url)
    temp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:10]}.partial")
    try:
        with fs.open(path, "rb") as src, open(temp, "xb") as dst:
            size = _copy_stream(src, dst)
        os.rename(temp, dest)
    except FileNotFoundError as exc:
        raise StageError(f"{url} does not exist") from exc
    except OSError as exc:
        raise StageError(f"downloading {url} failed: {exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
    return size


def push_tree(source: Path, url: str, name: str, *, format: str, work: Path,
              label: str, jobs: int = 8) -> PushResult:
    """Store the tree ``source`` at ``url`` as ``NAME.sqfs`` or ``NAME.tar``.

    ``work`` is a local scratch directory (removed by the caller).
    """
    name = check_name(name)
    if format == "squashfs":
        entries, _ = fill_hashes(source, scan(source), None, jobs)
        marker = Marker(id=uuid.uuid4().hex, source=label, created=0.0,
                        method="squashfs-mount", format="squashfs", image=name + IMAGE_SUFFIX)
        build = Path(tempfile.mkdtemp(prefix="image-", dir=work))
        try:
            image = make_image(source, entries, build, name + IMAGE_SUFFIX, marker, jobs)
            target = join(url, name + IMAGE_SUFFIX)
            return PushResult(target, "squashfs", push_file(image, target))
        finally:
            with contextlib.suppress(OSError):
                remove_tree(build)
    target = join(url, name + TAR_SUFFIX)
    with _uploading(target) as (fs, partial):
        with fs.open(partial, "wb") as out, tarfile.open(fileobj=out, mode="w|",
                                                        format=tarfile.PAX_FORMAT) as tar:
            for entry in scan(source):
                tar.add(source / entry.path, arcname=entry.path, recursive=False)
        size = int(fs.size(partial))
    return PushResult(target, "tar", size)


def stage_from_url(url: str, to: Path, *, cache_root: Path, name: str | None = None,
                   holder: Holder, mount_image: bool | None = None,
                   local: bool = False) -> StageResult:
    """Fetch the squashfs image at ``url`` and mount or unpack it at ``to/name`` (``local``:
    this node's own copy, see :func:`ocistage.stagers.directory.stage_directory`)."""
    base = url.rstrip("/").rsplit("/", 1)[-1]
    if not base.endswith(IMAGE_SUFFIX):
        raise StageError(f"{url} is not a squashfs image (*{IMAGE_SUFFIX})",
                         "fetch tar archives yourself; ocistage stages .sqfs images from URLs")
    name = name or base[: -len(IMAGE_SUFFIX)]
    with Staging(to, name, cache_root=cache_root, holder=holder, what=url,
                 local=local) as staging:
        staging.refuse_foreign("squashfs")
        if staging.marker is not None:
            # an image fetched before: URLs carry no cheap change check; unstage to refresh
            return staging.unchanged(0, staging.marker.method)
        built = staging.scratch() / image_path(staging.final).name
        fetch_file(url, built)
        method = install_image(staging, built, url, mount_image)
        if method == "squashfs-mount":
            write_outer_marker(staging.final, staging.lease, url)
        # the image carries the manifest of its tree: report that tree, as a local image does
        manifest = load_manifest(staging.final / MANIFEST_NAME)
        entries = list(manifest.entries) if manifest is not None else []
        files = sum(1 for e in entries if e.type == "file")
        return StageResult(staging.final, files, files, 0, 0, tree_size(entries),
                           staging.lease.id, method)


def write_outer_marker(final: Path, lease: Lease, url: str) -> None:
    """Name ``lease`` in ``TO/.NAME.ocistage-staged.json`` (:mod:`ocistage.cache.targetlayout`).

    The marker inside a fetched image was written when it was pushed and names no lease of
    this cache; the image is read-only, so ``cache gc`` learns from the outer marker which
    lease the mount belongs to (and collects it once that lease is dead).
    """
    marker = Marker(id=lease.id, source=url, created=time.time(), method="squashfs-mount",
                    format="squashfs", image=final.name + IMAGE_SUFFIX)
    fd = os.open(final.parent, DIR_FOLLOW)
    try:  # write_at's temp name is bounded (ocistage.stagers.target.MAX_NAME), no host in it
        write_at(fd, outer_marker_name(final.name), marker.to_json())
        os.fsync(fd)
    finally:
        os.close(fd)
