"""The YAML that registries.d files hold: nested block mappings of plain or quoted scalars.

containers-registries.d(5) files are maps of maps of strings (``default-docker:``,
``docker:`` and namespaces, ``lookaside: URL``). This reader takes that shape and refuses
anything else (sequences, flow collections, anchors, tags, multi-line scalars) with a
:class:`YamlError` naming the line: a registries.d file is configuration a site writes, and
PyYAML is no dependency of ocistage for four keys (docs/trust.md).
"""

from __future__ import annotations

import json
import re
from typing import Any

_KEY_RE = re.compile(
    r"""("(?:[^"\\]|\\.)*"|'(?:[^']|'')*'"""  # a quoted key
    r"""|[^\s#'"{}\[\]&*!|>%@`,][^#]*?)"""  # a plain key: up to the first ": " (or end)
    r"""\s*:(?:\s+|$)(.*)$""")


class YamlError(Exception):
    """Not the YAML subset registries.d files use; the message names the line."""


def _strip_comment(text: str) -> str:
    quote = ""
    for n, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (n == 0 or text[n - 1] in " \t"):
            return text[:n].rstrip()
    return text.rstrip()


def _scalar(text: str, line: int) -> Any:
    if not text or text == "~" or text == "null":
        return None
    if text[0] == '"':
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise YamlError(f"line {line}: bad double-quoted string") from None
        if not isinstance(value, str):
            raise YamlError(f"line {line}: bad double-quoted string")
        return value
    if text[0] == "'":
        if len(text) < 2 or text[-1] != "'" or "'" in text[1:-1].replace("''", ""):
            raise YamlError(f"line {line}: bad single-quoted string")
        return text[1:-1].replace("''", "'")
    if text[0] in "{}[]&*!|>%@`,-?":
        raise YamlError(f"line {line}: only plain or quoted strings are supported here")
    if text in ("true", "True", "TRUE"):
        return True
    if text in ("false", "False", "FALSE"):
        return False
    return text


def parse(text: str) -> dict[str, Any]:
    """The mapping in ``text``; an empty document is an empty mapping."""
    lines: list[tuple[int, int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        body = _strip_comment(raw)
        if not body.strip() or (not lines and body.strip() == "---"):
            continue
        stripped = body.lstrip(" ")
        if stripped.startswith("\t") or "\t" in body[:len(body) - len(stripped)]:
            raise YamlError(f"line {number}: tabs are not allowed in indentation")
        lines.append((number, len(body) - len(stripped), stripped))
    root: dict[str, Any] = {}
    # (indent of the mapping's keys, the mapping); the key awaiting a nested mapping
    stack: list[tuple[int, dict[str, Any]]] = [(0, root)]
    pending: tuple[dict[str, Any], str, int] | None = None
    for number, indent, body in lines:
        match = _KEY_RE.match(body)
        if match is None:
            raise YamlError(f"line {number}: expected `key: value`")
        key = _scalar(match.group(1).strip(), number)
        if not isinstance(key, str):
            raise YamlError(f"line {number}: a key must be a string")
        if pending is not None:
            parent, parent_key, parent_indent = pending
            pending = None
            if indent > parent_indent:
                child: dict[str, Any] = {}
                parent[parent_key] = child
                stack.append((indent, child))
        while stack and indent < stack[-1][0]:
            stack.pop()
        if not stack or indent != stack[-1][0]:
            raise YamlError(f"line {number}: inconsistent indentation")
        mapping = stack[-1][1]
        if key in mapping:
            raise YamlError(f"line {number}: duplicate key {key!r}")
        value = match.group(2).strip()
        mapping[key] = _scalar(value, number)
        if not value:
            pending = (mapping, key, indent)
    return root
