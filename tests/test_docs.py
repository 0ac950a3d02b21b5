"""The documentation names what exists: modules, functions, files, fixtures, variables.

A module moved or renamed, a fixture or an ``OCISTAGE_*`` variable added without a word in
docs/, leaves a stale or missing reference that these tests name.
"""

from __future__ import annotations

import ast
import importlib
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("ocistage", "cache", "stagers", "runtimes", "bundler")
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
ROLE = re.compile(r":(?:mod|func|class|meth|data|attr|exc|obj):`~?((?:ocistage|pytest_ocistage)"
                  r"(?:\.\w+)*)`")
DOTTED = re.compile(r"(?<![\w/.$-])((?:ocistage|pytest_ocistage)(?:\.[A-Za-z_]\w*)+)")
PATH = re.compile(r"(?<![\w/.$~-])((?:[\w.-]+/)+[\w-]+\.py)\b")


def _sources(folders: tuple[str, ...]) -> list[Path]:
    """The product's (or the plugin's) .py files; ocistage/'s links to the folders skipped."""
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative.parts[0] == "ocistage" and len(relative.parts) > 2:
                continue
            if "__pycache__" not in relative.parts:
                found.append(path)
    return found


def _exists(name: str) -> bool:
    """``name`` is an importable module, or an attribute path inside one (a dataclass field or
    an annotated attribute counts: it exists on instances)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif attr in getattr(obj, "__annotations__", {}) or attr in getattr(
                    obj, "__dataclass_fields__", {}):
                return attr == parts[-1]
            else:
                return False
        return True
    return False


def _loggers() -> set[str]:
    """Logger names the product uses (``ocistage.retry``): dotted, but not modules."""
    names = set()
    for path in _sources(PRODUCT):
        names.update(re.findall(r"getLogger\(\"([\w.]+)\"\)", path.read_text(encoding="utf-8")))
    return names


def _runner_attribute(name: str) -> bool:
    """``ocistage.run_process`` in docs/testing.md: an attribute of the ``ocistage`` fixture's
    runner, not of the package."""
    from pytest_ocistage.runner import OcistageRunner

    head, _, attr = name.partition(".")
    return head == "ocistage" and "." not in attr and (
        hasattr(OcistageRunner, attr) or attr in OcistageRunner.__annotations__)


def test_docstring_references_name_what_exists() -> None:
    stale = []
    for path in _sources((*PRODUCT, "pytest_ocistage")):
        for match in ROLE.finditer(path.read_text(encoding="utf-8")):
            if not _exists(match.group(1)):
                stale.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert stale == []


def test_docs_dotted_names_exist() -> None:
    loggers = _loggers()
    stale = []
    for doc in DOCS:
        for match in DOTTED.finditer(doc.read_text(encoding="utf-8")):
            name = match.group(1)
            if name in loggers or (doc.name == "testing.md" and _runner_attribute(name)):
                continue
            if not _exists(name):
                stale.append(f"{doc.relative_to(ROOT)}: {name}")
    assert stale == []


def test_docs_paths_exist() -> None:
    """``folder/module.py`` in docs/*.md and README.md: a file of the repository (from its
    root, or the tail of a longer path: ``cli/pyxis.py``)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.split()
    tracked += [p.relative_to(ROOT).as_posix() for p in ROOT.glob("tests/**/*.py")]
    stale = []
    for doc in DOCS:
        for match in PATH.finditer(doc.read_text(encoding="utf-8")):
            path = match.group(1)
            if not (ROOT / path).is_file() and not any(
                    t == path or t.endswith("/" + path) for t in tracked):
                stale.append(f"{doc.relative_to(ROOT)}: {path}")
    assert stale == []


def test_the_reference_checks_catch_stale_names() -> None:
    """The checks themselves: a moved module and a missing attribute are not found."""
    assert _exists("ocistage.cache.store.Store")
    assert _exists("ocistage.errors.OcistageError")
    assert not _exists("ocistage.stagers.session")  # now stagers/transaction.py
    assert not _exists("ocistage.cache.store.NoSuchThing")
    assert "ocistage.retry" in _loggers()
    assert logging.getLogger("ocistage.retry").name == "ocistage.retry"
    assert PATH.findall("see `stagers/session.py` and cache/gc.py.") == [
        "stagers/session.py", "cache/gc.py"]


def _plugin_fixtures(tmp_path: Path) -> set[str]:
    """The fixtures the installed plugin registers, as ``pytest --fixtures`` lists them."""
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    listing = subprocess.run(
        [sys.executable, "-m", "pytest", "--fixtures", "-v", "-p", "no:cacheprovider",
         "test_nothing.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    names: set[str] = set()
    ours = False
    for line in listing.stdout.splitlines():
        if line.startswith("-") and "fixtures defined from" in line:
            ours = "fixtures defined from pytest_ocistage" in line
        elif ours and (match := re.match(r"([a-z]\w*)\b", line)):
            names.add(match.group(1))
    return names


def test_every_plugin_fixture_is_documented(tmp_path: Path) -> None:
    fixtures = _plugin_fixtures(tmp_path)
    assert {"oci_registry", "ocistage", "slurm_cluster"} <= fixtures
    testing = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(\w+)", testing))
    internal = {"ocistage_session_dir", "oci_tls_material", "oci_signing_key"}
    assert fixtures - documented - internal == set(), "fixtures missing from docs/testing.md"


def _environment_variables(folders: tuple[str, ...]) -> set[str]:
    names: set[str] = set()
    for path in _sources(folders):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(re.findall(r"(?<![\w$])\$?(OCISTAGE_[A-Z0-9_]*[A-Z0-9])",
                                        node.value))
    return names


def test_every_environment_variable_is_documented() -> None:
    """Every ``OCISTAGE_*`` the product names (in a string: where it reads it, its help and
    its docstrings) is in docs/config.md's list of where settings come from, before its first
    section; the plugin's are in docs/testing.md."""
    product = _environment_variables(PRODUCT)
    assert {"OCISTAGE_CACHE", "OCISTAGE_CA_FILE", "OCISTAGE_PYXIS_STORE"} <= product
    config = (ROOT / "docs" / "config.md").read_text(encoding="utf-8").split("\n## ", 1)[0]
    assert {n for n in product if not re.search(rf"\b{n}\b", config)} == set()
    plugin = _environment_variables(("pytest_ocistage",)) - product
    plugin.discard("OCISTAGE_FIXTURE")  # an Env entry of a fixture image, not read
    assert "OCISTAGE_REQUIRE_E2E" in plugin
    testing = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    assert {n for n in plugin if not re.search(rf"\b{n}\b", testing)} == set()


@pytest.mark.parametrize("doc, limit", [("docs/performance.md", 400), ("bench/README.md", 200)])
def test_performance_docs_stay_references(doc: str, limit: int) -> None:
    """Goals, method and current results (docs/performance.md) and how to run the benchmarks
    (bench/README.md), not lab notes: past rounds go to docs/history/performance-log.md, which
    both link."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= limit, f"{doc} has {lines} lines: move past runs to docs/history/"
    assert "history/performance-log.md" in text
    assert (ROOT / "docs" / "history" / "performance-log.md").is_file()
