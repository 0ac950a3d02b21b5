"""docs/architecture.md's generated tables say what the code says (``make docs`` rewrites them).

The tables of modules and errors are made by scripts/architecture_tables.py from the module
docstrings and the error classes; these tests fail when the committed document differs from
what the script makes now, so a new, moved or deleted module, a changed docstring or a new
error needs ``make docs`` (and a look at the prose around the tables).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "architecture_tables", ROOT / "scripts" / "architecture_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    return _generator()


def test_generated_tables_are_current(generator: ModuleType) -> None:
    current, wanted, _problems = generator.generate()
    assert current == wanted, (
        "docs/architecture.md differs from what scripts/architecture_tables.py makes of the "
        "code: run `make docs` (python scripts/architecture_tables.py --check shows the diff)")


def test_every_module_has_a_summary_sentence(generator: ModuleType) -> None:
    _current, _wanted, problems = generator.generate()
    assert problems == []


def test_every_product_module_is_in_the_table(generator: ModuleType) -> None:
    """Independent of the generator's own walk: each .py file under the product's folders
    (ocistage/'s links to the folders excluded) has a row, and every row names a file."""
    text = DOC.read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([\w/.]+)` \|", text, re.MULTILINE))
    files = set()
    for folder in ("ocistage", "cache", "stagers", "runtimes", "bundler", "pytest_ocistage"):
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT)
            if relative.parts[0] == "ocistage" and len(relative.parts) > 2:
                continue  # ocistage/bundler/... is bundler/... through a link
            if "__pycache__" in relative.parts:
                continue
            shown = relative.as_posix()
            files.add(shown[: -len("__init__.py")] if shown.endswith("/__init__.py") else shown)
    module_rows = {row for row in rows if row.endswith((".py", "/"))}
    assert files - module_rows == set(), "modules missing from docs/architecture.md"
    assert module_rows - files == set(), "rows of docs/architecture.md naming no module"


def test_every_error_of_the_hierarchy_is_listed() -> None:
    """Each subclass of OcistageError, found by importing the modules that define one."""
    import ocistage.errors

    text = DOC.read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `[\w/.]+\.py` \| `(\w+)` \|", text, re.MULTILINE))
    found: set[str] = set()
    for folder in ("ocistage", "cache", "stagers", "runtimes", "bundler"):
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT)
            if relative.parts[0] == "ocistage" and len(relative.parts) > 2:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            if not any(isinstance(node, ast.ClassDef) for node in tree.body):
                continue
            parts = list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts if parts[0] == "ocistage" else ["ocistage", *parts])
            module = importlib.import_module(name)
            for value in vars(module).values():
                if (isinstance(value, type) and issubclass(value, ocistage.errors.OcistageError)
                        and value.__module__ == name):
                    found.add(value.__name__)
    assert "OcistageError" in found and "StageError" in found
    assert found == listed


def test_main_flows_name_functions_that_exist() -> None:
    """The 'Main flows' section names each flow's entry as `path/module.py` `function`."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Main flows", 1)[1].split("\n## ", 1)[0]
    entries = re.findall(r"`([\w/]+\.py)` `(\w+)`", section)
    assert len(entries) >= 4
    for path, function in entries:
        source = (ROOT / path).read_text(encoding="utf-8")
        names = {node.name for node in ast.parse(source).body
                 if isinstance(node, ast.FunctionDef | ast.ClassDef)}
        assert function in names, f"docs/architecture.md: {path} has no {function}"


def test_check_mode_fails_on_a_stale_table(generator: ModuleType, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The machinery itself: a table missing a row is reported, and a rewrite restores it."""
    stale = tmp_path / "architecture.md"
    stale.write_text(re.sub(r"^\| `cache/gc\.py` \|.*\n", "", DOC.read_text(encoding="utf-8"),
                            flags=re.MULTILINE), encoding="utf-8")
    monkeypatch.setattr(generator, "DOC", stale)
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0
    assert "| `cache/gc.py` |" in stale.read_text(encoding="utf-8")
    assert generator.main(["--check"]) == 0
