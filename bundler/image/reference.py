"""Image references: where an image comes from.

Four kinds of source, written the way skopeo writes them so users can paste the same strings:

``[docker://]NAME[:TAG][@DIGEST]``  a registry image (:class:`RegistryReference`)
``oci:PATH[:NAME]``                 an OCI image layout directory (:class:`OciLayoutReference`)
``oci-archive:FILE[:NAME]``         a tar of an OCI image layout (:class:`OciArchiveReference`)
``docker-archive:FILE[:NAME:TAG]``  ``docker save`` output (:class:`DockerArchiveReference`)

Registry names follow the distribution/reference grammar::

    reference      := name [ ":" tag ] [ "@" digest ]
    name           := [ domain "/" ] path-component ( "/" path-component )*
    domain         := host [ ":" port ]                       port: 1 to 65535
    host           := domain-name | "[" ipv6 "]"
    domain-name    := label ( "." label )*
    label          := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
    path-component := [a-z0-9]+ ( separator [a-z0-9]+ )*      separator: "." | "_" | "__" | "-"+
    tag            := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}

and Docker's normalisation: the first component is a registry only if it contains ``.`` or
``:`` or is ``localhost``, otherwise the registry is ``docker.io``; ``index.docker.io`` is
``docker.io``; single-component names on ``docker.io`` live under ``library/``; a reference
without tag or digest means ``:latest``. For ``oci:`` and ``oci-archive:`` the path ends at the
first ``:`` (as in containers/image), so such paths cannot contain ``:``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ocistage.bundler.image.errors import InvalidReference
from ocistage.cache.digest import Digest
from ocistage.errors import UsageError

DEFAULT_REGISTRY = "docker.io"
LEGACY_DEFAULT_REGISTRY = "index.docker.io"
OFFICIAL_REPOSITORY_PREFIX = "library/"
DEFAULT_TAG = "latest"
NAME_TOTAL_LENGTH_MAX = 255
PORT_MAX = 65535

_DOCKER_PREFIX = "docker://"
_OCI_PREFIX = "oci:"
_OCI_ARCHIVE_PREFIX = "oci-archive:"
_DOCKER_ARCHIVE_PREFIX = "docker-archive:"
_PATH_PREFIXES = ("./", "../", "/", "~")

_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_RE = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?", re.ASCII)
_PATH_COMPONENT_RE = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*", re.ASCII)
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", re.ASCII)
_IMAGE_ID_RE = re.compile(r"[a-f0-9]{64}", re.ASCII)
# The name of an image inside an OCI layout (org.opencontainers.image.ref.name), as
# containers/image validates it.
_OCI_NAME_COMPONENT = r"[A-Za-z0-9]+(?:(?:[-._:@+]|--)[A-Za-z0-9]+)*"
_OCI_NAME_RE = re.compile(rf"{_OCI_NAME_COMPONENT}(?:/{_OCI_NAME_COMPONENT})*", re.ASCII)
_FORBIDDEN_CHARS_RE = re.compile(r"[\s\x00-\x1f\x7f]")


@dataclass(frozen=True)
class RegistryReference:
    """An image in a registry, normalised (``docker.io/library/alpine:latest``)."""

    registry: str
    repository: str
    tag: str | None
    digest: Digest | None

    def __post_init__(self) -> None:
        if self.tag is None and self.digest is None:
            raise InvalidReference(f"reference to {self.registry}/{self.repository} "
                                   "has neither a tag nor a digest")
        check_registry(self.registry, self.registry)
        _check_repository(self.repository, self.repository)
        if self.tag is not None:
            _check_tag(self.tag, self.tag)
        if len(self.name) > NAME_TOTAL_LENGTH_MAX:
            raise InvalidReference(
                f"image name {self.name[:40]!r}... is {len(self.name)} characters long, "
                f"more than {NAME_TOTAL_LENGTH_MAX}",
                f"a name (registry/repository) has at most {NAME_TOTAL_LENGTH_MAX} characters")

    @property
    def name(self) -> str:
        """``registry/repository``, without tag or digest."""
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """What to ask the registry for: the digest if there is one, else the tag."""
        if self.digest is not None:
            return str(self.digest)
        assert self.tag is not None  # __post_init__ guarantees one of them
        return self.tag

    def __str__(self) -> str:
        return self.name + self._suffix()

    def _suffix(self) -> str:
        text = f":{self.tag}" if self.tag is not None else ""
        if self.digest is not None:
            text += f"@{self.digest}"
        return text


@dataclass(frozen=True)
class OciLayoutReference:
    """``oci:PATH[:NAME]``: an image in an OCI image layout directory."""

    path: Path
    tag: str | None

    def __str__(self) -> str:
        return _join_local(_OCI_PREFIX, self.path, self.tag)


@dataclass(frozen=True)
class OciArchiveReference:
    """``oci-archive:FILE[:NAME]``: an image in a tar archive of an OCI image layout."""

    path: Path
    tag: str | None

    def __str__(self) -> str:
        return _join_local(_OCI_ARCHIVE_PREFIX, self.path, self.tag)


@dataclass(frozen=True)
class DockerArchiveReference:
    """``docker-archive:FILE[:NAME:TAG]``: ``docker save`` output.

    ``image`` is the canonical form of the named image (``docker.io/library/alpine:latest``);
    compare it with ``str(parse_registry_reference(repo_tag))`` of the archive's RepoTags.
    """

    path: Path
    image: str | None

    def __str__(self) -> str:
        return _join_local(_DOCKER_ARCHIVE_PREFIX, self.path, self.image)


ImageSource = RegistryReference | OciLayoutReference | OciArchiveReference | DockerArchiveReference


def parse_reference(text: str) -> ImageSource:
    """Parse any image reference a user may type; raises :class:`InvalidReference`.

    Text that looks like a path (``./x``, ``../x``, ``/x``, ``~/x``) is never a registry
    reference: it is refused with "no such file or directory" or, if it exists, with the
    prefix that would read it.
    """
    _check_characters(text)
    if text in (".", "..") or text.startswith(_PATH_PREFIXES):
        raise _path_given(text)
    if text.startswith(_OCI_ARCHIVE_PREFIX):
        path, name = _split_local(text, _OCI_ARCHIVE_PREFIX)
        return OciArchiveReference(path, _check_oci_name(name, text))
    if text.startswith(_OCI_PREFIX):
        path, name = _split_local(text, _OCI_PREFIX)
        return OciLayoutReference(path, _check_oci_name(name, text))
    if text.startswith(_DOCKER_ARCHIVE_PREFIX):
        path, name = _split_local(text, _DOCKER_ARCHIVE_PREFIX)
        return DockerArchiveReference(path, _docker_archive_image(name, text))
    return parse_registry_reference(text)


def _path_given(text: str) -> InvalidReference:
    try:
        path = Path(os.path.expanduser(text))
    except RuntimeError:  # ~name of a user that does not exist
        path = Path(text)
    hint = ("for an image on disk write oci:PATH (an OCI image layout), oci-archive:FILE or "
            "docker-archive:FILE; `ocistage stage` takes bundle directories")
    if not path.exists():
        return InvalidReference(f"no such file or directory: {text}", hint)
    kind = "directory" if path.is_dir() else "file"
    return InvalidReference(f"{text} is a {kind}, not an image reference", hint)


def parse_registry_reference(text: str, shown: str | None = None) -> RegistryReference:
    """Parse ``[docker://]NAME[:TAG][@DIGEST]`` and normalise it the way Docker does.
    ``shown``: what the user typed, named in the errors instead of ``text`` (the importer
    parses enroot's ``REGISTRY#IMAGE`` with a stand-in registry)."""
    body = text.removeprefix(_DOCKER_PREFIX)
    text = text if shown is None else shown
    _check_characters(text)
    if not body:
        raise InvalidReference(f"{text!r} names no image" if text else "empty image reference")
    if _IMAGE_ID_RE.fullmatch(body):
        raise InvalidReference(
            f"{text!r} looks like an image ID, not a reference",
            "name the image (alpine:3.19) or pin it with NAME@sha256:<digest>")

    digest: Digest | None = None
    if "@" in body:
        body, _, digest_text = body.partition("@")
        digest = _parse_digest(digest_text, text)

    name, tag = body, None
    colon = body.rfind(":")
    if colon > body.rfind("/"):
        name, tag = body[:colon], body[colon + 1:]
        if not tag:
            raise InvalidReference(f"{text!r} ends its name with ':' but gives no tag")
        _check_tag(tag, text)
    if not name:
        raise InvalidReference(f"{text!r} has no image name")

    registry, repository = _split_registry(name)
    check_registry(registry, text)
    _check_repository(repository, text)
    if tag is None and digest is None:
        tag = DEFAULT_TAG
    return RegistryReference(registry, repository, tag, digest)


def _split_registry(name: str) -> tuple[str, str]:
    first, slash, rest = name.partition("/")
    if not slash or not (any(c in first for c in ".:") or first == "localhost"):
        registry, repository = DEFAULT_REGISTRY, name
    else:
        registry, repository = first, rest
    if registry == LEGACY_DEFAULT_REGISTRY:
        registry = DEFAULT_REGISTRY
    if registry == DEFAULT_REGISTRY and "/" not in repository:
        repository = OFFICIAL_REPOSITORY_PREFIX + repository
    return registry, repository


def _check_characters(text: str) -> None:
    bad = _FORBIDDEN_CHARS_RE.search(text)
    if bad is not None:
        what = "whitespace" if bad.group().isspace() else "a control character"
        raise InvalidReference(f"image reference {text!r} contains {what}",
                               "remove spaces and quotes around the reference")


def check_registry(domain: str, text: str) -> None:
    """Raise :class:`InvalidReference` unless ``domain`` is a registry, ``host[:port]`` with a
    port from 1 to 65535 (``text``: where it was written, for the message)."""
    if not _DOMAIN_RE.fullmatch(domain):
        raise InvalidReference(f"invalid registry {domain!r} in {text!r}",
                               "a registry is a host name or [IPv6] address with an optional :port")
    _, colon, port = domain.rpartition(":")
    if colon and port.isdigit() and not (len(port) <= 5 and 0 < int(port) <= PORT_MAX):
        raise InvalidReference(f"invalid registry {domain!r} in {text!r}: port {port} is out "
                               f"of range", f"a port is a number from 1 to {PORT_MAX}")


def _check_repository(repository: str, text: str) -> None:
    if not repository:
        raise InvalidReference(f"{text!r} has no repository name")
    if repository.lower() != repository:
        raise InvalidReference(
            f"repository name {repository!r} in {text!r} must be lowercase",
            f"registries only know lowercase names; did you mean {repository.lower()!r}?")
    for component in repository.split("/"):
        if not _PATH_COMPONENT_RE.fullmatch(component):
            shown = repr(component) if component else "an empty component"
            raise InvalidReference(
                f"invalid repository name {repository!r} in {text!r}: {shown}",
                "repository path components are lowercase letters and digits separated by "
                "single '/', with '.', '_', '__' or dashes inside a component")


def _check_tag(tag: str, text: str) -> None:
    if not _TAG_RE.fullmatch(tag):
        raise InvalidReference(
            f"invalid tag {tag!r} in {text!r}",
            "a tag is up to 128 letters, digits, '_', '.' and '-', not starting with '.' or '-'")


def _parse_digest(digest_text: str, text: str) -> Digest:
    if not digest_text:
        raise InvalidReference(f"{text!r} ends with '@' but gives no digest")
    try:
        return Digest.parse(digest_text)
    except UsageError as exc:
        raise InvalidReference(f"invalid digest in {text!r}: {exc.message}", exc.hint) from exc


def _split_local(text: str, prefix: str) -> tuple[Path, str | None]:
    """``PREFIX PATH[:NAME]`` -> (PATH, NAME); the path ends at the first ``:``."""
    rest = text[len(prefix):]
    path, colon, name = rest.partition(":")
    if not path:
        raise InvalidReference(f"{text!r} gives no path after {prefix!r}")
    if colon and not name:
        raise InvalidReference(f"{text!r} ends with ':' but gives no image name")
    if name.startswith("@"):
        raise InvalidReference(f"{text!r} selects an image by index, which is not supported",
                               f"name the image instead: {prefix}PATH:NAME")
    return Path(path), (name if colon else None)


def _check_oci_name(name: str | None, text: str) -> str | None:
    if name is not None and not _OCI_NAME_RE.fullmatch(name):
        raise InvalidReference(
            f"invalid image name {name!r} in {text!r}",
            "an image name in an OCI layout is letters and digits separated by "
            "'/', '-', '.', '_', ':', '@', '+' or '--' (the path itself cannot contain ':')")
    return name


def _docker_archive_image(name: str | None, text: str) -> str | None:
    if name is None:
        return None
    try:
        image = parse_registry_reference(name)
    except InvalidReference as exc:
        raise InvalidReference(f"invalid image name in {text!r}: {exc.message}", exc.hint) from exc
    if image.digest is not None or name.startswith(_DOCKER_PREFIX):
        raise InvalidReference(f"{text!r} names the image by digest or transport",
                               "docker-archive: images are named NAME:TAG (as in `docker save`)")
    return str(image)


def _join_local(prefix: str, path: Path, name: str | None) -> str:
    return f"{prefix}{path}" + (f":{name}" if name is not None else "")
