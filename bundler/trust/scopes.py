"""Which scope of a policy applies to an image: containers/image's ``requirementsForImageRef``.

A docker image is looked up by its identity (``host[:port]/repo:tag`` or ``host/repo@digest``),
then its repository, each parent namespace up to the host, then ``*.domain`` wildcards of the
host (without its port), then the transport's ``""`` scope, then ``default``. A path transport
(``oci:``, ``oci-archive:``) is looked up by its resolved path (the image name or tag is no
part of it, as in containers/image), then each parent directory; a ``docker-archive:`` has
no identity (only its transport's ``""`` scope applies).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ocistage.bundler.image.reference import (
    DockerArchiveReference,
    ImageSource,
    OciArchiveReference,
    OciLayoutReference,
    RegistryReference,
)
from ocistage.bundler.trust.identity import DockerName
from ocistage.bundler.trust.policy import Policy, Requirements


@dataclass(frozen=True)
class ImageIdentity:
    """What a policy knows of an image: its transport, its policy identity, the namespaces
    to try after it (most specific first), and its docker reference if it has one."""

    transport: str
    identity: str
    namespaces: tuple[str, ...]
    docker: DockerName | None = None


@dataclass(frozen=True)
class ScopeMatch:
    """The requirements that apply and where they come from."""

    transport: str | None  # None: the policy's default
    scope: str
    requirements: Requirements

    def describe(self) -> str:
        if self.transport is None:
            return "default"
        return f'transports.{self.transport}["{self.scope}"]'


def docker_namespaces(name: str) -> tuple[str, ...]:
    """The repository, its parent namespaces up to the host, then the host's wildcards."""
    found: list[str] = []
    while True:
        found.append(name)
        slash = name.rfind("/")
        if slash == -1:
            break
        name = name[:slash]
    host = name.split(":", 1)[0]
    while "." in host:
        host = host[host.index(".") + 1:]
        found.append("*." + host)
    return tuple(found)


def _path_namespaces(path: str) -> tuple[str, ...]:
    """The parent directories of ``path``, nearest first, without ``/`` (the default ``""``
    stands for it)."""
    found: list[str] = []
    while True:
        slash = path.rfind("/")
        if slash <= 0:
            break
        path = path[:slash]
        found.append(path)
    return tuple(found)


def _resolved(path: os.PathLike[str] | str) -> str:
    # explicitfilepath.ResolvePathToFullyExplicit: absolute, links resolved (a missing last
    # component is kept as named)
    return os.path.realpath(os.path.abspath(path))


def image_identity(source: ImageSource) -> ImageIdentity:
    if isinstance(source, RegistryReference):
        docker = DockerName(source.name, source.tag, source.digest)
        return ImageIdentity("docker", str(docker), docker_namespaces(source.name), docker)
    # as containers/image 5.23: the image name or tag is no part of a path transport's
    # identity ("DIR:name" and "DIR" may name the same image), only the resolved path
    if isinstance(source, OciLayoutReference | OciArchiveReference):
        transport = "oci" if isinstance(source, OciLayoutReference) else "oci-archive"
        path = _resolved(source.path)
        return ImageIdentity(transport, path, _path_namespaces(path))
    assert isinstance(source, DockerArchiveReference)
    # containers/image: a docker-archive has no identity; only the "" scope applies
    return ImageIdentity("docker-archive", "", ())


def requirements_for(policy: Policy, image: ImageIdentity) -> ScopeMatch:
    scopes = policy.transports.get(image.transport)
    if scopes is not None:
        for scope in (image.identity, *image.namespaces):
            if scope in scopes:
                return ScopeMatch(image.transport, scope, scopes[scope])
        if "" in scopes:
            return ScopeMatch(image.transport, "", scopes[""])
    return ScopeMatch(None, "", policy.default)
