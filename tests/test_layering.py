"""Dependencies point one way (DESIGN.md, docs/architecture.md): bundler -> cache,
stagers -> cache, runtimes -> (stagers, cache, and a few leaf modules of bundler that read or
rewrite a bundle's config), bundler/staging.py -> stagers (a REF is bundled, then staged),
bundler/submitting.py -> runtimes (a REF is bundled, then submitted); the
CLI modules (bundler/cli*.py) are the only ones that import all four."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cache", "bundler", "stagers", "runtimes")
ALLOWED = {
    "cache": {"cache"},
    "bundler": {"bundler", "cache"},
    "stagers": {"stagers", "cache"},
    "runtimes": {"runtimes", "stagers", "cache"},
}
#: single modules another package may import beyond ALLOWED: one implementation of rootless
#: id mapping and config rewriting, for `bundle` and for scrun's stage-in, and the PATH lookup
#: inside a bundle that submit needs for Slurm 24.05 (leaves: the standard library, cache, and
#: each other)
EXTRA = {"runtimes": {"bundler.idmap", "bundler.rootless", "bundler.bundle_command"}}
#: single modules that may import a package beyond ALLOWED
MODULE_EXTRA = {"bundler/staging.py": {"stagers"}, "bundler/submitting.py": {"runtimes"}}
LEAVES = {"bundler.idmap": set(), "bundler.rootless": {"bundler.idmap"},
          "bundler.bundle_command": {"bundler.userdb"}, "bundler.userdb": set()}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name for name in names if name.split(".")[0] in PACKAGES}


def test_every_import_points_down() -> None:
    wrong = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).glob("*.py")):
            if package == "bundler" and path.name.startswith("cli"):
                continue
            for name in _imports(path):
                top = name.split(".")[0]
                if (top in ALLOWED[package] or name in EXTRA.get(package, ())
                        or top in MODULE_EXTRA.get(f"{package}/{path.name}", ())):
                    continue
                wrong.append(f"{package}/{path.name} imports {name}")
    assert wrong == []


def test_the_bundler_modules_runtimes_import_are_leaves() -> None:
    for module, allowed in LEAVES.items():
        path = ROOT / (module.replace(".", "/") + ".py")
        upward = {name for name in _imports(path) if not name.startswith("cache")}
        assert upward <= allowed, module
