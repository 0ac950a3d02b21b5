"""containers-registries.d(5): where an image's signatures are (its lookaside store).

Every ``*.yaml`` file of the directory is read; ``default-docker`` and each ``docker:``
namespace may be defined once across them (containers/image refuses a second definition).
An image's store is that of its identity, else of its most specific namespace (repository,
parent namespaces, host, ``*.domain``), else ``default-docker``'s, else the default store
(``/var/lib/containers/sigstore`` for root, ``~/.local/share/containers/sigstore`` for a user).
``lookaside`` is read, else the older ``sigstore``; the ``-staging`` keys are for writers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ocistage.bundler.trust import miniyaml
from ocistage.bundler.trust.boundedread import BoundedReadError, read_regular
from ocistage.bundler.trust.errors import PolicyError
from ocistage.bundler.trust.identity import DockerName
from ocistage.bundler.trust.scopes import docker_namespaces

FILE_LIMIT = 1 << 20
FILES_LIMIT = 1000
ROOT_STORE = "/var/lib/containers/sigstore"


@dataclass(frozen=True)
class RegistriesD:
    """The merged registries.d configuration: namespace -> lookaside URL."""

    directory: Path | None
    default_docker: str | None = None
    docker: dict[str, str | None] = field(default_factory=dict)


def _lookaside(entry: Any, where: str) -> str | None:
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise PolicyError(f"invalid registries.d file {where}: a namespace must be a mapping")
    for key in ("lookaside", "sigstore"):
        value = entry.get(key)
        if value is not None and value != "":
            if not isinstance(value, str):
                raise PolicyError(f"invalid registries.d file {where}: {key} must be a string")
            return value
    return None


def read_registries_d(directory: Path) -> RegistriesD:
    """The configuration in ``directory``; a missing directory configures nothing."""
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(".yaml"))
    except FileNotFoundError:
        return RegistriesD(directory)
    except OSError as exc:
        raise PolicyError(f"cannot read registries.d {directory}: {exc.strerror}") from None
    if len(names) > FILES_LIMIT:
        raise PolicyError(f"registries.d {directory} holds more than {FILES_LIMIT} files")
    default: str | None = None
    default_from: Path | None = None
    docker: dict[str, str | None] = {}
    origin: dict[str, Path] = {}
    for name in names:
        path = directory / name
        try:
            text = read_regular(path, FILE_LIMIT).decode("utf-8")
            document = miniyaml.parse(text)
        except BoundedReadError as exc:
            if not path.exists() and not path.is_symlink():
                continue
            raise PolicyError(f"cannot read registries.d file {path}: {exc}") from None
        except (UnicodeDecodeError, miniyaml.YamlError) as exc:
            raise PolicyError(f"invalid registries.d file {path}: {exc}") from None
        if "default-docker" in document and document["default-docker"] is not None:
            if default_from is not None:
                raise PolicyError(f'"default-docker" is defined both in {default_from} '
                                  f"and {path}")
            default, default_from = _lookaside(document["default-docker"], str(path)), path
        namespaces = document.get("docker")
        if namespaces is None:
            continue
        if not isinstance(namespaces, dict):
            raise PolicyError(f"invalid registries.d file {path}: docker must be a mapping")
        for namespace, entry in namespaces.items():
            if namespace in origin:
                raise PolicyError(f'"docker" namespace {namespace!r} is defined both in '
                                  f"{origin[namespace]} and {path}")
            origin[namespace] = path
            docker[namespace] = _lookaside(entry, str(path))
    return RegistriesD(directory, default, docker)


def default_store(home: Path) -> str:
    if os.geteuid() == 0:
        return "file://" + ROOT_STORE
    return "file://" + str(home / ".local/share/containers/sigstore")


def lookaside_base(config: RegistriesD, image: DockerName, home: Path) -> str:
    """The lookaside store's top-level URL for ``image``."""
    for scope in (str(image), *docker_namespaces(image.name)):
        url = config.docker.get(scope)
        if url:
            return url
    if config.default_docker:
        return config.default_docker
    return default_store(home)
