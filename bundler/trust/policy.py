"""containers-policy.json(5): the model and a parser as strict as containers/image 5.23's.

As there, every object accepts exactly its documented keys (an unknown or repeated key is an
error), a requirement list is never empty, ``default`` is mandatory, and a ``signedBy`` names
its keys in exactly one of ``keyPath``, ``keyPaths`` and ``keyData``. A problem is one
:class:`~ocistage.bundler.trust.errors.PolicyError` naming the file and the problem.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ocistage.bundler.trust.errors import PolicyError
from ocistage.bundler.trust.identity import DockerName, parse_docker_name
from ocistage.cache.jsondoc import DuplicateKey, unique_keys

#: a policy file is small; more is not a policy
POLICY_LIMIT = 1 << 20
JSON_DEPTH_LIMIT = 32

#: transports whose scopes ocistage checks (containers/image validates these, and leaves the
#: scopes of others unchecked)
PATH_TRANSPORTS = ("oci", "oci-archive", "dir")
IDENTITY_TYPES = ("matchExact", "matchRepoDigestOrExact", "matchRepository", "exactReference",
                  "exactRepository", "remapIdentity")
KEY_TYPES = ("GPGKeys", "signedByGPGKeys", "X509Certificates", "signedByX509CAs")

_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"  # noqa: E501
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# what go-digest's Parse accepts: a registered algorithm and its hex length
_DIGEST_RE = re.compile(r"sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128}",
                        re.ASCII)
_PREFIX_RE = re.compile(rf"{_DOMAIN}|(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*", re.ASCII)


@dataclass(frozen=True)
class SignedIdentity:
    """A ``signedIdentity``: how a signature's docker reference must relate to the image's."""

    type: str = "matchRepoDigestOrExact"
    reference: DockerName | None = None  # exactReference's dockerReference
    repository: DockerName | None = None  # exactRepository's dockerRepository
    prefix: str = ""  # remapIdentity
    signed_prefix: str = ""

    def describe(self) -> str:
        if self.type == "exactReference" and self.reference is not None:
            return f"exactReference {self.reference}"
        if self.type == "exactRepository" and self.repository is not None:
            return f"exactRepository {self.repository.name}"
        if self.type == "remapIdentity":
            return f"remapIdentity {self.prefix} -> {self.signed_prefix}"
        return self.type


@dataclass(frozen=True)
class Requirement:
    """One policy requirement: ``insecureAcceptAnything``, ``reject``, ``signedBy``,
    ``signedBaseLayer`` or ``sigstoreSigned``."""

    type: str
    key_type: str = ""
    key_paths: tuple[str, ...] = ()
    key_data: bytes | None = None
    identity: SignedIdentity = field(default_factory=SignedIdentity)

    def describe(self) -> str:
        if self.type != "signedBy":
            return self.type
        keys = ("keyData" if self.key_data is not None
                else ("keyPath " if len(self.key_paths) == 1 else "keyPaths ")
                + ", ".join(self.key_paths))
        return f"signedBy {self.key_type} ({keys}; signedIdentity {self.identity.describe()})"

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": self.type}
        if self.type == "signedBy":
            entry.update(key_type=self.key_type, key_paths=list(self.key_paths),
                         key_data=self.key_data is not None,
                         signed_identity=self.identity.describe())
        return entry


Requirements = tuple[Requirement, ...]


@dataclass(frozen=True)
class Policy:
    """A parsed policy file: the default requirements and each transport's scopes."""

    path: Path | None
    default: Requirements
    transports: Mapping[str, Mapping[str, Requirements]] = field(default_factory=dict)

    @property
    def origin(self) -> str:
        return str(self.path) if self.path is not None else "(built in)"


#: today's behaviour when no policy file exists anywhere
ACCEPT_ANYTHING = Policy(None, (Requirement("insecureAcceptAnything"),))


class _Problem(Exception):
    """A policy problem, before the file name is known."""


def _depth(value: Any, limit: int) -> None:
    if limit <= 0:
        raise _Problem("nested too deeply")
    children = (value.values() if isinstance(value, dict)
                else value if isinstance(value, list) else ())
    for child in children:
        _depth(child, limit - 1)


def _object(value: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Problem(f"{where} must be a JSON object")
    for key in value:
        if key not in allowed:
            raise _Problem(f"{where} has an unknown key {key!r} (allowed: {', '.join(allowed)})")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _Problem(f"{where} must be a string")
    return value


def _docker_name(value: Any, where: str, *, need_tag_or_digest: bool) -> DockerName:
    text = _string(value, where)
    name = parse_docker_name(text)
    if name is None:
        raise _Problem(f"{where} {text!r} is not a valid docker reference")
    if need_tag_or_digest and name.name_only:
        raise _Problem(f"{where} {text!r} contains neither a tag nor a digest")
    return name


def _prefix(value: Any, where: str) -> str:
    text = _string(value, where)
    if not _PREFIX_RE.fullmatch(text):
        raise _Problem(f"{where} {text!r} is not a valid prefix (host[:port], or a repository "
                       "or namespace with its host)")
    return text


def parse_identity(value: Any, where: str) -> SignedIdentity:
    if not isinstance(value, dict) or "type" not in value:
        raise _Problem(f"{where} must be an object with a \"type\"")
    kind = value["type"]
    if kind in ("matchExact", "matchRepoDigestOrExact", "matchRepository"):
        _object(value, where, ("type",))
        return SignedIdentity(kind)
    if kind == "exactReference":
        body = _object(value, where, ("type", "dockerReference"))
        if "dockerReference" not in body:
            raise _Problem(f"{where}: exactReference needs \"dockerReference\"")
        return SignedIdentity(kind, reference=_docker_name(
            body["dockerReference"], f"{where}.dockerReference", need_tag_or_digest=True))
    if kind == "exactRepository":
        body = _object(value, where, ("type", "dockerRepository"))
        if "dockerRepository" not in body:
            raise _Problem(f"{where}: exactRepository needs \"dockerRepository\"")
        return SignedIdentity(kind, repository=_docker_name(
            body["dockerRepository"], f"{where}.dockerRepository", need_tag_or_digest=False))
    if kind == "remapIdentity":
        body = _object(value, where, ("type", "prefix", "signedPrefix"))
        if "prefix" not in body or "signedPrefix" not in body:
            raise _Problem(f"{where}: remapIdentity needs \"prefix\" and \"signedPrefix\"")
        return SignedIdentity(kind, prefix=_prefix(body["prefix"], f"{where}.prefix"),
                              signed_prefix=_prefix(body["signedPrefix"],
                                                    f"{where}.signedPrefix"))
    raise _Problem(f"{where} has an unknown type {kind!r} (known: {', '.join(IDENTITY_TYPES)})")


def _signed_by(value: dict[str, Any], where: str) -> Requirement:
    body = _object(value, where, ("type", "keyType", "keyPath", "keyPaths", "keyData",
                                  "signedIdentity"))
    if "keyType" not in body:
        raise _Problem(f"{where}: signedBy needs \"keyType\"")
    key_type = _string(body["keyType"], f"{where}.keyType")
    if key_type not in KEY_TYPES:
        raise _Problem(f"{where}.keyType {key_type!r} is unknown (known: {', '.join(KEY_TYPES)})")
    given = [key for key in ("keyPath", "keyPaths", "keyData") if key in body]
    if len(given) != 1:
        raise _Problem(f"{where}: exactly one of keyPath, keyPaths and keyData must be given")
    paths: tuple[str, ...] = ()
    data: bytes | None = None
    if "keyPath" in body:
        paths = (_string(body["keyPath"], f"{where}.keyPath"),)
    elif "keyPaths" in body:
        listed = body["keyPaths"]
        if not isinstance(listed, list) or not listed:
            raise _Problem(f"{where}.keyPaths must be a non-empty list of strings")
        paths = tuple(_string(item, f"{where}.keyPaths[]") for item in listed)
    else:
        text = _string(body["keyData"], f"{where}.keyData")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _Problem(f"{where}.keyData is not valid base64") from exc
    identity = (parse_identity(body["signedIdentity"], f"{where}.signedIdentity")
                if "signedIdentity" in body else SignedIdentity())
    return Requirement("signedBy", key_type=key_type, key_paths=paths, key_data=data,
                       identity=identity)


def _sigstore(value: dict[str, Any], where: str) -> Requirement:
    body = _object(value, where, ("type", "keyPath", "keyData", "fulcio", "rekorPublicKeyPath",
                                  "rekorPublicKeyData", "signedIdentity"))
    if "signedIdentity" in body:
        parse_identity(body["signedIdentity"], f"{where}.signedIdentity")
    return Requirement("sigstoreSigned")


def parse_requirement(value: Any, where: str) -> Requirement:
    if not isinstance(value, dict) or "type" not in value:
        raise _Problem(f"{where} must be an object with a \"type\"")
    kind = value["type"]
    if kind in ("insecureAcceptAnything", "reject"):
        _object(value, where, ("type",))
        return Requirement(kind)
    if kind == "signedBy":
        return _signed_by(value, where)
    if kind == "sigstoreSigned":
        return _sigstore(value, where)
    if kind == "signedBaseLayer":
        body = _object(value, where, ("type", "baseLayerIdentity"))
        if "baseLayerIdentity" not in body:
            raise _Problem(f"{where}: signedBaseLayer needs \"baseLayerIdentity\"")
        parse_identity(body["baseLayerIdentity"], f"{where}.baseLayerIdentity")
        return Requirement(kind)
    raise _Problem(f"{where} has an unknown requirement type {kind!r} (known: "
                   "insecureAcceptAnything, reject, signedBy, sigstoreSigned)")


def parse_requirements(value: Any, where: str) -> Requirements:
    if not isinstance(value, list):
        raise _Problem(f"{where} must be a list of requirements")
    if not value:
        raise _Problem(f"{where}: a list of requirements must not be empty")
    return tuple(parse_requirement(item, f"{where}[{n}]") for n, item in enumerate(value))


def _check_scope(transport: str, scope: str, where: str) -> None:
    if scope == "":
        return
    if transport == "docker-archive":
        raise _Problem(f'{where}: docker-archive does not support any scopes except the '
                       'default "" one')
    if transport == "docker-daemon" and _DIGEST_RE.fullmatch(scope):
        raise _Problem(f"{where}: docker-daemon can not use the algo:digest value {scope!r} "
                       "as a namespace")
    if transport not in PATH_TRANSPORTS:
        return
    directory = scope.split(":", 1)[0] if transport != "dir" else scope
    if not directory.startswith("/"):
        raise _Problem(f"{where}: scope {scope!r} must be an absolute path")
    if scope == "/":
        raise _Problem(f"{where}: scope \"/\" is not allowed; use the default scope \"\"")
    import posixpath

    if posixpath.normpath(directory) != directory:
        raise _Problem(f"{where}: scope {scope!r} is not in canonical form "
                       f"(perhaps {posixpath.normpath(directory)!r})")


def parse_policy_data(data: bytes) -> tuple[Requirements, dict[str, dict[str, Requirements]]]:
    """The default and transports of a policy document; :class:`_Problem` if invalid."""
    try:
        document = json.loads(data.decode("utf-8"), object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        raise _Problem(str(exc)) from exc
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _Problem(f"not valid JSON: {exc}") from exc
    _depth(document, JSON_DEPTH_LIMIT)
    body = _object(document, "the policy", ("default", "transports"))
    if "default" not in body:
        raise _Problem("\"default\" is missing")
    default = parse_requirements(body["default"], "default")
    transports: dict[str, dict[str, Requirements]] = {}
    if "transports" in body and body["transports"] is not None:
        listed = body["transports"]
        if not isinstance(listed, dict):
            raise _Problem("\"transports\" must be an object")
        for transport, scopes in listed.items():
            where = f"transports.{transport}"
            if not isinstance(scopes, dict):
                raise _Problem(f"{where} must be an object of scopes")
            parsed: dict[str, Requirements] = {}
            for scope, requirements in scopes.items():
                _check_scope(transport, scope, where)
                parsed[scope] = parse_requirements(requirements, f'{where}["{scope}"]')
            transports[transport] = parsed
    return default, transports


def parse_policy(data: bytes, path: Path | None) -> Policy:
    """The policy in ``data`` (read from ``path``), or a PolicyError naming the file."""
    try:
        default, transports = parse_policy_data(data)
    except _Problem as exc:
        raise PolicyError(f"invalid policy in {path or '(data)'}: {exc}") from None
    return Policy(path, default, transports)


def read_policy(path: Path) -> Policy:
    """The policy file at ``path`` (a bounded read of a regular file, never a FIFO)."""
    from ocistage.bundler.trust.boundedread import BoundedReadError, read_regular

    try:
        data = read_regular(path, POLICY_LIMIT)
    except BoundedReadError as exc:
        raise PolicyError(f"cannot read the policy {path}: {exc}") from None
    return parse_policy(data, path)
