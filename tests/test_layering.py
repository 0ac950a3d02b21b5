"""Dependencies point one way (docs/architecture.md), the command line included.

The layers, bottom to top: the error base and the result protocol (``ocistage.errors``,
``ocistage.results``); ``cache``; ``stagers``; ``runtimes``; inside ``bundler`` the image
model (``bundler.image``), then the registry client (``bundler.registry``) and the layer
unpacker (``bundler.unpack``), then image trust (``bundler.trust``), then bundler's own
modules (pull, bundle, stage, submit), then the command line (``bundler.cli``), pyxis's
importer (``bundler.pyxis``: a program of its own, which uses the command line's lean modules)
and the ``ocistage`` package itself (``python -m ocistage``). A module imports its own layer or the
ones below it, never one above; the pytest plugin sits beside the product and may use any of
it. Every import is checked, also those made inside functions (the CLI's lazy ones), and every
name is spelt ``ocistage.``: the repository's top-level folders are no import names of their
own (issue 24: a user's ``cache.py``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("ocistage", "bundler", "cache", "stagers", "runtimes", "pytest_ocistage")

#: bottom to top; a module belongs to the longest prefix that names it
LAYERS = (
    "ocistage.errors",
    "ocistage.results",
    "ocistage.cache",
    "ocistage.stagers",
    "ocistage.runtimes",
    "ocistage.bundler.image",
    "ocistage.bundler.registry",
    "ocistage.bundler.unpack",
    "ocistage.bundler.trust",
    "ocistage.bundler",
    "ocistage.bundler.cli",
    "ocistage.bundler.pyxis",
    "ocistage",
    "pytest_ocistage",
)
#: layers that share a level: neither imports the other
SIDE_BY_SIDE = {frozenset({"ocistage.bundler.registry", "ocistage.bundler.unpack"})}


def _module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[0] not in ("ocistage", "pytest_ocistage"):
        parts.insert(0, "ocistage")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _product_files() -> Iterator[Path]:
    for folder in FOLDERS:
        # the links in ocistage/ lead to the other folders: each file once, by its real path
        yield from (path for path in sorted((ROOT / folder).rglob("*.py"))
                    if not any(part.is_symlink() for part in path.relative_to(ROOT).parents
                               if str(part) != "." and (ROOT / part).is_symlink()))


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # `from ocistage.bundler import pull`: the module is the name imported
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _layer(module: str) -> str:
    found = [layer for layer in LAYERS if module == layer or module.startswith(layer + ".")]
    return max(found, key=len)


def _known_modules() -> set[str]:
    return {_module_name(path) for path in _product_files()}


def test_the_product_files_are_found() -> None:
    modules = _known_modules()
    assert {"ocistage.bundler.cli.app", "ocistage.cache.store", "ocistage.stagers.directory",
            "ocistage.runtimes.scrun", "ocistage.bundler.unpack.apply",
            "pytest_ocistage.plugin", "ocistage"} <= modules
    assert not any(name.startswith("ocistage.ocistage") for name in modules)


def test_every_import_points_down() -> None:
    known = _known_modules()
    wrong = []
    for path in _product_files():
        module = _module_name(path)
        here = LAYERS.index(_layer(module))
        for name in sorted(_imports(path) & known):
            target = _layer(name)
            if module == name or name == "ocistage":
                continue
            if frozenset({_layer(module), target}) in SIDE_BY_SIDE:
                wrong.append(f"{module} imports {name} (side by side)")
            elif LAYERS.index(target) > here:
                wrong.append(f"{module} imports {name} (upward)")
    assert wrong == []


def test_no_import_uses_a_folder_name_as_a_package() -> None:
    """``import cache`` works in a checkout (its root is on sys.path) but not installed, and
    it would take a user's own ``cache.py``: every import is spelt ``ocistage.``."""
    roots = ("bundler", "cache", "stagers", "runtimes")
    wrong = []
    for path in [*_product_files(), *sorted((ROOT / "tests").rglob("*.py")),
                 *sorted((ROOT / "bench").rglob("*.py"))]:
        for name in _imports(path):
            if name.split(".")[0] in roots:
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert wrong == []


@pytest.mark.parametrize("folder", ["bundler", "cache", "stagers", "runtimes"])
def test_the_namespace_links_name_the_folders(folder: str) -> None:
    link = ROOT / "ocistage" / folder
    assert link.is_symlink() and link.resolve() == ROOT / folder


def test_every_subpackage_is_built() -> None:
    """pyproject.toml lists the packages (package-dir maps the folders): a new subpackage
    missing from the list would be left out of the wheel."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    found = {_module_name(path) for path in _product_files() if path.name == "__init__.py"}
    assert listed == found
