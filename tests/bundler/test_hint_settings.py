"""Every message that tells a user to set something in the config file names a key the config
file has, and every ``$OCISTAGE_...`` it names is a variable ocistage reads (issue 38: the
importer's hint named ``insecure_registries``, which the config file ignores with a warning).

The texts are read from the product's source (string literals and the constant parts of
f-strings, docstrings left out), so a hint added anywhere is checked without being listed."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from ocistage.bundler.settings import KEYS, REGISTRY_KEYS

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("bundler", "cache", "stagers", "runtimes")
#: a text that sends the user to the config file
CONFIG = re.compile(r"config file|site config|config key")
#: what such a text names as a key: `key`, snake_case_word, or ``key = `` (TOML)
KEY = re.compile(r"`([a-z][a-z0-9_]*)`|\b([a-z]+(?:_[a-z0-9]+)+)\b|\b([a-z][a-z0-9_]*) = ")
VARIABLE = re.compile(r"\$?\b(OCISTAGE_[A-Z0-9_]+)")


def _texts() -> Iterator[tuple[str, int, str]]:
    """(file, line, text) of every string literal of the product that is not a docstring."""
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                               ast.AsyncFunctionDef))
                          and node.body and isinstance(node.body[0], ast.Expr)
                          and isinstance(node.body[0].value, ast.Constant)}
            for node in ast.walk(tree):
                if id(node) in docstrings:
                    continue
                if isinstance(node, ast.JoinedStr):
                    text = "".join(part.value for part in node.values
                                   if isinstance(part, ast.Constant)
                                   and isinstance(part.value, str))
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    text = node.value
                else:
                    continue
                yield f"{path.relative_to(REPO)}", node.lineno, text


def _variables_read() -> set[str]:
    """The ``OCISTAGE_...`` names the product looks up (quoted in its source)."""
    names: set[str] = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            names.update(re.findall(r"[\"'](OCISTAGE_[A-Z0-9_]+)[\"']", path.read_text()))
    return names


def test_hints_name_only_keys_the_config_file_has() -> None:
    known = set(KEYS) | set(REGISTRY_KEYS)
    wrong = []
    for where, line, text in _texts():
        if CONFIG.search(text) is None:
            continue
        named = [next(group for group in match if group) for match in KEY.findall(text)]
        wrong += [f"{where}:{line}: {name!r} in {text!r}" for name in named if name not in known]
    assert wrong == []


def test_hints_name_only_variables_ocistage_reads() -> None:
    read = _variables_read()
    assert "OCISTAGE_CACHE" in read  # the scan finds what it is meant to
    wrong = [f"{where}:{line}: {name} in {text!r}" for where, line, text in _texts()
             for name in VARIABLE.findall(text) if text.strip() != name and name not in read]
    assert wrong == []


def test_the_scan_sees_the_hints() -> None:
    """The texts checked above include the hints the issue was about."""
    texts = [text for _where, _line, text in _texts() if CONFIG.search(text)]
    assert any("stage_to" in text for text in texts)
    assert any("OCISTAGE_INSECURE_REGISTRIES" in text for text in texts)
