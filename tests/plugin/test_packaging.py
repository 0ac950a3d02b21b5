"""The plugin installs with the distribution and depends one way: nothing in ocistage imports it."""

from __future__ import annotations

import ast
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import pytest_ocistage.plugin

REPO = Path(__file__).resolve().parents[2]
LIBRARY = ("bundler", "cache", "stagers", "runtimes")


def test_the_plugin_is_a_pytest11_entry_point(pytestconfig: pytest.Config) -> None:
    (entry,) = [e for e in entry_points(group="pytest11") if e.name == "ocistage"]
    assert entry.value == "pytest_ocistage.plugin"
    assert pytestconfig.pluginmanager.get_plugin("ocistage") is pytest_ocistage.plugin


def test_no_library_module_imports_the_plugin() -> None:
    offenders = []
    for package in LIBRARY:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                offenders += [f"{path.relative_to(REPO)}: {name}" for name in names
                              if name.split(".")[0] in ("pytest_ocistage", "pytest", "tests")]
    assert offenders == []
