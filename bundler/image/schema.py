"""JSON-schema validation of OCI documents.

The schemas in ``bundler/image/schemas/`` are written for ocistage from image-spec v1.1, the
Docker v2 schema 2 manifest and manifest list, and runtime-spec v1.2 (Linux). They are package data,
loaded with :mod:`importlib.resources` (never from the network) and compiled once per kind.

``validate(document, kind)`` returns nothing or raises
:class:`ocistage.bundler.image.errors.SchemaError` naming the JSON path of the most relevant
problem, e.g.
``runtime-config: $.linux.namespaces[0].type: 'net' is not one of 'mount', 'pid', ...``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any, Literal, get_args

from jsonschema import Draft202012Validator
from jsonschema.exceptions import (
    ValidationError,
    best_match,
)
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from ocistage.bundler.image.errors import SchemaError

Kind = Literal[
    "image-manifest",
    "image-index",
    "image-config",
    "docker-manifest",
    "docker-manifest-list",
    "runtime-config",
]
KINDS: tuple[Kind, ...] = get_args(Kind)

_SHARED = ("defs",)
_MAX_SHOWN = 120

_HINTS: dict[str, str] = {
    "image-manifest": "the registry or image layout served a malformed OCI image manifest",
    "image-index": "the registry or image layout served a malformed OCI image index",
    "image-config": "the image configuration blob is malformed; rebuild or re-push the image",
    "docker-manifest": "the registry served a malformed Docker v2 schema 2 manifest",
    "docker-manifest-list": "the registry served a malformed Docker manifest list",
    "runtime-config": (
        "the generated config.json does not satisfy the OCI runtime spec; "
        "check the --env/--mount/--cmd options given"
    ),
}


def _load(name: str) -> dict[str, Any]:
    schemas = resources.files("ocistage.bundler.image").joinpath("schemas")
    text = schemas.joinpath(f"{name}.json").read_text("utf-8")
    schema = json.loads(text)
    if not isinstance(schema, dict):
        raise SchemaError(f"schema {name}.json is not a JSON object",
                          "the ocistage installation is damaged; reinstall it")
    return schema


@cache
def _registry() -> Registry[Any]:
    shared: list[Resource[Any]] = [DRAFT202012.create_resource(_load(name)) for name in _SHARED]
    return Registry().with_resources((resource.id() or "", resource) for resource in shared)


@cache
def _validator(kind: Kind) -> Any:
    # the schemas themselves are checked against the metaschema by the tests, not every run
    return Draft202012Validator(_load(kind), registry=_registry())


def _shown(value: object) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _describe(error: ValidationError) -> str:
    """A one-line, bounded description of one schema violation."""
    describe = _DESCRIBERS.get(str(error.validator))
    if describe is not None:
        return describe(error.validator_value, error.instance)
    message: str = error.message
    return message if len(message) <= 2 * _MAX_SHOWN else message[: 2 * _MAX_SHOWN - 3] + "..."


def _missing(expected: Any, instance: Any) -> str:
    missing = [name for name in expected if isinstance(instance, dict) and name not in instance]
    return f"missing required property {missing[0]!r}" if missing else "missing property"


def _wrong_type(expected: Any, instance: Any) -> str:
    allowed = expected if isinstance(expected, list) else [expected]
    return f"expected {' or '.join(allowed)}, got {_json_type(instance)} {_shown(instance)}"


def _not_one_of(expected: Any, instance: Any) -> str:
    choices = ", ".join(_shown(choice) for choice in expected)
    return f"{_shown(instance)} is not one of {choices}"


# how each schema keyword's violation is described: (the keyword's value, the instance) -> text
_DESCRIBERS: dict[str, Callable[[Any, Any], str]] = {
    "required": _missing,
    "type": _wrong_type,
    "const": lambda expected, instance: f"expected {_shown(expected)}, got {_shown(instance)}",
    "enum": _not_one_of,
    "pattern": lambda expected, instance:
        f"{_shown(instance)} does not match the pattern {expected}",
    "minimum": lambda expected, instance:
        f"{_shown(instance)} is out of range (must be >= {expected})",
    "maximum": lambda expected, instance:
        f"{_shown(instance)} is out of range (must be <= {expected})",
    "minItems": lambda expected, instance:
        f"expected at least {expected} item(s), got {len(instance)}",
    "minLength": lambda expected, instance:
        f"{_shown(instance)} is too short (at least {expected} character(s))",
}


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def validate(document: object, kind: Kind) -> None:
    """Check ``document`` (parsed JSON) against the schema of ``kind``.

    Raises :class:`SchemaError` naming the JSON path of the most relevant problem.
    """
    if kind not in KINDS:
        raise SchemaError(f"unknown document kind {kind!r}",
                          f"known kinds: {', '.join(KINDS)}")
    error = best_match(_validator(kind).iter_errors(document))
    if error is None:
        return
    raise SchemaError(f"{kind}: {error.json_path}: {_describe(error)}", _HINTS[kind])
