"""Where image content comes from: a registry, an OCI layout, an OCI archive, a docker archive.

Every source is an :class:`ImageProvider`: it resolves its reference to a top-level manifest or
index (bytes plus digest), fetches further manifests by digest, and streams blobs into a sink
(a :class:`ocistage.cache.ingest.Ingest`) that verifies them before they are published. `pull.py`
holds the policy (platform selection, parallelism, what to store); providers only move bytes.

``docker-archive:`` files (``docker save``) have no OCI manifest: the provider synthesises one
from the archive's ``manifest.json`` and the image config, so the rest of ocistage sees an
ordinary OCI image. Its layers are usually uncompressed tars whose digest equals their diff_id;
compressed ones are hashed once to learn their digest.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from ocistage.bundler.errors import SourceError
from ocistage.bundler.image import mediatypes
from ocistage.bundler.image.errors import InvalidReference
from ocistage.bundler.image.reference import (
    DockerArchiveReference,
    ImageSource,
    OciArchiveReference,
    OciLayoutReference,
    RegistryReference,
    parse_registry_reference,
)
from ocistage.bundler.registry.types import BlobSink, FetchedManifest, RegistryConfig
from ocistage.cache.digest import Digest, hash_file
from ocistage.cache.jsondoc import MAX_DOCUMENT, parse_json, read_document
from ocistage.errors import IntegrityError, Interrupted, NotFound

if TYPE_CHECKING:
    import tarfile

    from ocistage.bundler.registry.client import RegistryClient

CHUNK = 1 << 20
REF_NAME = "org.opencontainers.image.ref.name"

Progress = Callable[[int], None]
_LAYER_TYPES = {"gzip": mediatypes.OCI_LAYER_GZIP, "zstd": mediatypes.OCI_LAYER_ZSTD,
                "none": mediatypes.OCI_LAYER}


class ImageProvider(Protocol):
    """The byte-moving half of a pull; see the module docstring."""

    name: str

    def resolve(self) -> FetchedManifest: ...

    def manifest(self, digest: Digest) -> FetchedManifest: ...

    def fetch_blob(self, digest: Digest, size: int | None, sink: BlobSink,
                   progress: Progress | None = None, urls: tuple[str, ...] = ()) -> None: ...

    def abort(self) -> None:
        """Stop every transfer in flight at once (from another thread: Ctrl-C)."""
        ...

    def close(self) -> None: ...


def open_provider(source: ImageSource, config: RegistryConfig) -> ImageProvider:
    if isinstance(source, RegistryReference):
        return RegistryProvider(source, config)
    if isinstance(source, OciLayoutReference):
        return OciLayoutProvider(source.path, source.tag)
    if isinstance(source, OciArchiveReference):
        return OciArchiveProvider(source.path, source.tag)
    if isinstance(source, DockerArchiveReference):
        return DockerArchiveProvider(source.path, source.image)
    raise SourceError(f"unsupported image source {source!r}")


class _LocalProvider:
    """What the file-based providers share: copying a stream into a sink, until aborted."""

    def __init__(self) -> None:
        self._aborted = threading.Event()

    def abort(self) -> None:
        self._aborted.set()

    def _copy_into(self, stream: IO[bytes], sink: BlobSink, progress: Progress | None) -> None:
        if sink.offset:
            skipped = 0
            while skipped < sink.offset:
                chunk = stream.read(min(CHUNK, sink.offset - skipped))
                if not chunk:
                    sink.restart()
                    return self._copy_into(stream, sink, progress)
                skipped += len(chunk)
        while chunk := stream.read(CHUNK):
            if self._aborted.is_set():
                raise Interrupted("interrupted")
            sink.write(chunk)
            if progress is not None:
                progress(len(chunk))


def _fetched(data: bytes, digest: Digest | None, what: str) -> FetchedManifest:
    if len(data) > MAX_DOCUMENT:
        raise SourceError(f"{what} is larger than {MAX_DOCUMENT} bytes")
    actual = Digest.of_bytes(data)
    if digest is not None and actual != digest:
        raise IntegrityError(f"{what} has digest {actual}, expected {digest}")
    try:
        media_type = str(parse_json(data).get("mediaType") or "")
    except (ValueError, AttributeError) as exc:
        raise SourceError(f"{what} is not a JSON object") from exc
    return FetchedManifest(media_type=media_type, digest=actual, data=data)


# -- registry -------------------------------------------------------------------------------


class RegistryProvider:
    def __init__(self, reference: RegistryReference, config: RegistryConfig) -> None:
        from ocistage.bundler.registry.client import (
            RegistryClient,  # the HTTP client: only for registries
        )

        self.reference = reference
        self.name = str(reference)
        self.client: RegistryClient = RegistryClient(reference.registry, config)

    def resolve(self) -> FetchedManifest:
        return self.client.get_manifest(self.reference.repository, self.reference.reference,
                                        accept=mediatypes.MANIFEST_ACCEPT)

    def manifest(self, digest: Digest) -> FetchedManifest:
        return self.client.get_manifest(self.reference.repository, str(digest),
                                        accept=mediatypes.MANIFEST_ACCEPT)

    def fetch_blob(self, digest: Digest, size: int | None, sink: BlobSink,
                   progress: Progress | None = None, urls: tuple[str, ...] = ()) -> None:
        self.client.fetch_blob(self.reference.repository, digest, size, sink,
                               progress=progress, urls=urls)

    def abort(self) -> None:
        self.client.abort()

    def close(self) -> None:
        self.client.close()


# -- OCI image layout (oci:PATH[:tag]) -------------------------------------------------------


def _resolve_index(index_data: bytes, tag: str | None, where: str,
                   manifest: Callable[[Digest], FetchedManifest]) -> FetchedManifest:
    """The image that ``tag`` names in an OCI layout's index.json (any image if untagged).

    One match is fetched with ``manifest``; several matches (the same tag for several
    platforms) are handed over as an index of them, so platform selection applies as usual.
    """
    try:
        index = parse_json(index_data)
        manifests = [m for m in index.get("manifests", []) if isinstance(m, dict)]
    except (ValueError, AttributeError) as exc:
        raise SourceError(f"index.json of {where} is not a JSON object") from exc
    if tag is not None:
        matches = [m for m in manifests if m.get("annotations", {}).get(REF_NAME) == tag]
        if not matches:
            names = sorted({m.get("annotations", {}).get(REF_NAME, "") for m in manifests} - {""})
            raise NotFound(f"no image tagged {tag!r} in {where}",
                           f"tags there: {', '.join(names) or 'none'}")
    else:
        matches = manifests
    if not matches:
        raise NotFound(f"{where} holds no image")
    if len(matches) == 1:
        return manifest(Digest.parse(str(matches[0].get("digest"))))
    if tag is None:
        raise SourceError(f"{where} holds {len(matches)} images; name one with :TAG",
                          "use oci:PATH:TAG (tags are the org.opencontainers.image.ref.name "
                          "annotations in index.json)")
    index_of_matches = {"schemaVersion": 2, "mediaType": mediatypes.OCI_INDEX,
                        "manifests": matches}
    return _fetched(json.dumps(index_of_matches).encode(), None, f"index of {where}")


class OciLayoutProvider(_LocalProvider):
    def __init__(self, path: Path, tag: str | None) -> None:
        super().__init__()
        self.root = path
        self.tag = tag
        self.name = f"oci:{path}" + (f":{tag}" if tag else "")
        if not (path / "oci-layout").is_file() or not (path / "index.json").is_file():
            raise SourceError(f"{path} is not an OCI image layout",
                              "an OCI layout has an oci-layout file and index.json")

    def _blob(self, digest: Digest) -> Path:
        path = self.root / "blobs" / digest.algorithm / digest.hex
        if not path.is_file():
            raise NotFound(f"blob {digest} is missing from {self.root}")
        return path

    def resolve(self) -> FetchedManifest:
        try:
            index = read_document(self.root / "index.json")
        except (OSError, ValueError) as exc:
            raise SourceError(f"cannot read {self.root / 'index.json'}: {exc}") from exc
        return _resolve_index(index, self.tag, str(self.root), self.manifest)

    def manifest(self, digest: Digest) -> FetchedManifest:
        with open(self._blob(digest), "rb") as blob:
            data = blob.read(MAX_DOCUMENT + 1)
        return _fetched(data, digest, f"manifest {digest.short} of {self.name}")

    def fetch_blob(self, digest: Digest, size: int | None, sink: BlobSink,
                   progress: Progress | None = None, urls: tuple[str, ...] = ()) -> None:
        with open(self._blob(digest), "rb") as blob:
            self._copy_into(blob, sink, progress)

    def close(self) -> None:
        pass


# -- tar archives ---------------------------------------------------------------------------


class _MemberReader(io.RawIOBase):
    """One member's bytes, read with ``pread`` at its offset in the archive.

    Readers share the archive's descriptor but no file position, so the blobs of one archive
    can be copied by several threads at once (a shared ``tarfile`` file object cannot: its
    seek-then-read interleaves across threads and hands one blob's bytes to another).
    """

    def __init__(self, fd: int, offset: int, size: int) -> None:
        super().__init__()
        self._fd = fd
        self._offset = offset
        self._end = offset + size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._end - self._offset)
        if want <= 0:
            return 0
        data = os.pread(self._fd, want, self._offset)
        if not data:
            raise SourceError("the archive ended inside a member (truncated?)")
        buffer[:len(data)] = data
        self._offset += len(data)
        return len(data)


class _TarSource:
    """Random access to members of an uncompressed tar archive, by normalised name."""

    def __init__(self, path: Path) -> None:
        import tarfile  # archives only: a pull from a registry or a layout never reads one

        self.path = path
        try:
            self.tar = tarfile.open(path, "r:")  # noqa: SIM115 - closed by close()
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, tarfile.TarError) as exc:
            raise SourceError(f"cannot read archive {path}: {exc}",
                              "archives must be uncompressed tar files") from exc
        self.members: dict[str, tarfile.TarInfo] = {}
        for member in self.tar.getmembers():
            name = posixpath.normpath(member.name.lstrip("/"))
            if member.isfile():
                self.members[name] = member
            elif member.issym() or member.islnk():
                self.members.setdefault(name, member)

    @contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        member = self._resolve(posixpath.normpath(name.lstrip("/")))
        if member.issparse():
            raise SourceError(f"{name} in {self.path} is a sparse file",
                              "image archives hold plain files")
        stream = io.BufferedReader(_MemberReader(self.fd, member.offset_data, member.size),
                                   CHUNK)
        try:
            yield stream
        finally:
            stream.close()

    def _resolve(self, name: str, depth: int = 0) -> tarfile.TarInfo:
        member = self.members.get(name)
        if member is None:
            raise NotFound(f"{name} is missing from {self.path}")
        if member.isfile():
            return member
        if depth > 8:
            raise SourceError(f"too many links resolving {name} in {self.path}")
        base = posixpath.dirname(name) if member.issym() else ""
        target = posixpath.normpath(posixpath.join(base, member.linkname).lstrip("/"))
        return self._resolve(target, depth + 1)

    def size(self, name: str) -> int:
        return self._resolve(posixpath.normpath(name.lstrip("/"))).size

    def read(self, name: str, limit: int = MAX_DOCUMENT) -> bytes:
        with self.open(name) as stream:
            data = stream.read(limit + 1)
        if len(data) > limit:
            raise SourceError(f"{name} in {self.path} is larger than {limit} bytes")
        return data

    def has(self, name: str) -> bool:
        return posixpath.normpath(name.lstrip("/")) in self.members

    def close(self) -> None:
        self.tar.close()
        os.close(self.fd)


class OciArchiveProvider(_LocalProvider):
    """``oci-archive:FILE[:tag]``: an OCI layout packed in a tar file."""

    def __init__(self, path: Path, tag: str | None) -> None:
        super().__init__()
        self.archive = _TarSource(path)
        self.tag = tag
        self.name = f"oci-archive:{path}" + (f":{tag}" if tag else "")
        if not self.archive.has("index.json"):
            raise SourceError(f"{path} is not an OCI archive (no index.json)")

    def resolve(self) -> FetchedManifest:
        return _resolve_index(self.archive.read("index.json"), self.tag, self.name,
                              self.manifest)

    def manifest(self, digest: Digest) -> FetchedManifest:
        data = self.archive.read(f"blobs/{digest.algorithm}/{digest.hex}")
        return _fetched(data, digest, f"manifest {digest.short} of {self.name}")

    def fetch_blob(self, digest: Digest, size: int | None, sink: BlobSink,
                   progress: Progress | None = None, urls: tuple[str, ...] = ()) -> None:
        with self.archive.open(f"blobs/{digest.algorithm}/{digest.hex}") as stream:
            self._copy_into(stream, sink, progress)

    def close(self) -> None:
        self.archive.close()


class DockerArchiveProvider(_LocalProvider):
    """``docker-archive:FILE[:name:tag]``: the output of ``docker save``."""

    def __init__(self, path: Path, image: str | None) -> None:
        super().__init__()
        self.archive = _TarSource(path)
        self.name = f"docker-archive:{path}" + (f":{image}" if image else "")
        try:
            entries = parse_json(self.archive.read("manifest.json"))
        except (NotFound, ValueError) as exc:
            raise SourceError(f"{path} is not a docker archive (no valid manifest.json)",
                              "make one with `docker save IMAGE -o FILE`") from exc
        if not isinstance(entries, list) or not entries:
            raise SourceError(f"manifest.json of {path} lists no image")
        self.entry = self._choose(entries, image, path)
        self.blob_members: dict[Digest, str] = {}
        self._synthetic: FetchedManifest | None = None

    @staticmethod
    def _choose(entries: list[Any], image: str | None, path: Path) -> dict[str, Any]:
        if image is None:
            if len(entries) > 1:
                raise SourceError(f"{path} holds {len(entries)} images; name one",
                                  "use docker-archive:FILE:NAME:TAG")
            return dict(entries[0])
        for entry in entries:
            for tag in entry.get("RepoTags") or []:
                try:
                    canonical = str(parse_registry_reference(str(tag)))
                except InvalidReference:
                    continue
                if canonical == image:
                    return dict(entry)
        raise NotFound(f"no image {image!r} in {path}")

    def _layer_digest(self, member: str, diff_id: str | None) -> tuple[Digest, int, str]:
        from ocistage.bundler.unpack.decompress import detect_compression  # isal, zstandard

        with self.archive.open(member) as stream:
            compression = detect_compression(stream.read(4))
        size = self.archive.size(member)
        media_type = _LAYER_TYPES[compression]
        if compression == "none" and diff_id is not None:
            # an uncompressed layer's digest is its diff_id; the copy verifies it anyway
            return Digest.parse(diff_id), size, media_type
        with self.archive.open(member) as stream:
            return hash_file(stream), size, media_type  # type: ignore[arg-type]

    def resolve(self) -> FetchedManifest:
        if self._synthetic is not None:
            return self._synthetic
        config_name = str(self.entry.get("Config", ""))
        config = self.archive.read(config_name)
        config_digest = Digest.of_bytes(config)
        try:
            diff_ids = list(parse_json(config).get("rootfs", {}).get("diff_ids", []))
        except (ValueError, AttributeError) as exc:
            raise SourceError(f"image config {config_name} in {self.name} is not JSON") from exc
        layers_names = [str(n) for n in self.entry.get("Layers", [])]
        if len(diff_ids) != len(layers_names):
            raise SourceError(f"{self.name}: {len(layers_names)} layers but "
                              f"{len(diff_ids)} diff_ids in the image config")
        self.blob_members[config_digest] = config_name
        layers = []
        for member, diff_id in zip(layers_names, diff_ids, strict=True):
            digest, size, media_type = self._layer_digest(member, diff_id)
            self.blob_members[digest] = member
            layers.append({"mediaType": media_type, "digest": str(digest), "size": size})
        manifest = {
            "schemaVersion": 2,
            "mediaType": mediatypes.OCI_MANIFEST,
            "config": {"mediaType": mediatypes.OCI_CONFIG, "digest": str(config_digest),
                       "size": len(config)},
            "layers": layers,
        }
        data = json.dumps(manifest, indent=2).encode()
        self._synthetic = FetchedManifest(mediatypes.OCI_MANIFEST, Digest.of_bytes(data), data)
        return self._synthetic

    def manifest(self, digest: Digest) -> FetchedManifest:
        resolved = self.resolve()
        if digest != resolved.digest:
            raise NotFound(f"manifest {digest} is not in {self.name}")
        return resolved

    def fetch_blob(self, digest: Digest, size: int | None, sink: BlobSink,
                   progress: Progress | None = None, urls: tuple[str, ...] = ()) -> None:
        member = self.blob_members.get(digest)
        if member is None:
            raise NotFound(f"blob {digest} is not in {self.name}")
        with self.archive.open(member) as stream:
            self._copy_into(stream, sink, progress)

    def close(self) -> None:
        self.archive.close()

