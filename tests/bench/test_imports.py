"""Every ``from ocistage... import NAME`` in bench/, also those inside functions (the bench
imports lazily), names a module and a name that exist: `python -m bench goals` once failed at
its first lazy import of a module a split had removed, which nothing else imports."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def ocistage_imports() -> list[tuple[str, int, str, str]]:
    found = []
    for path in sorted(BENCH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ocistage"):
                found += [(path.name, node.lineno, node.module or "", alias.name)
                          for alias in node.names]
    return found


@pytest.mark.parametrize(("where", "line", "module", "name"), ocistage_imports())
def test_the_bench_imports_what_exists(where: str, line: int, module: str, name: str) -> None:
    imported = importlib.import_module(module)
    assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), \
        f"bench/{where}:{line}: {module} has no {name}"
