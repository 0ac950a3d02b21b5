"""Rewrite the generated parts of docs/architecture.md from the code (``make docs``).

Between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->`` docs/architecture.md
holds text this script writes, never a person:

- ``modules``: one table per folder of the product (ocistage/, cache/, stagers/, runtimes/,
  bundler/ and each of its subpackages, pytest_ocistage/): every module with the first
  sentence of its docstring;
- ``errors``: every exception class of the one hierarchy (subclasses of
  ``ocistage.errors.OcistageError``, found in the source) with the module it lives in.

``python scripts/architecture_tables.py`` rewrites the file; ``--check`` only says whether it
is up to date (exit 1 with a diff if not). tests/test_architecture_doc.py runs the check, so a
new, moved or deleted module or a changed docstring fails the tests until ``make docs`` is run.
A module without a docstring, or whose first sentence is too long for a table, is an error:
its docstring is what a reader of the table sees.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
#: the product's folders, in the order of the layers (bottom first), then the plugin
FOLDERS = ("ocistage", "cache", "stagers", "runtimes", "bundler", "pytest_ocistage")
#: the longest first sentence a table entry may have (a docstring's summary, not its body)
MAX_SENTENCE = 200
BASE_ERROR = "OcistageError"


@dataclass(frozen=True)
class Module:
    path: str  # relative to ROOT, e.g. "cache/gc.py" (a package: "cache/__init__.py")
    sentence: str
    tree: ast.Module


def product_files() -> list[Path]:
    """Every product module, in path order; ocistage/'s links to the folders are not followed."""
    files: list[Path] = []
    for folder in FOLDERS:
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(ROOT)
            if any((ROOT / part).is_symlink() for part in _prefixes(relative)):
                continue
            if "__pycache__" in relative.parts:
                continue
            files.append(path)
    return files


def _prefixes(relative: Path) -> list[Path]:
    return [Path(*relative.parts[:n]) for n in range(1, len(relative.parts))]


def first_sentence(docstring: str) -> str:
    """The first sentence of a docstring's first paragraph, as Markdown on one line."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    match = re.search(r"[.!?](?=\s)", paragraph)
    sentence = paragraph[: match.end()] if match else paragraph
    sentence = re.sub(r":(?:mod|func|class|data|meth|attr|exc):`~?([^`]+)`", r"``\1``", sentence)
    sentence = sentence.replace("``", "`")
    return sentence.replace("|", "\\|")


def read_modules() -> tuple[list[Module], list[str]]:
    modules: list[Module] = []
    problems: list[str] = []
    for path in product_files():
        relative = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
        docstring = ast.get_docstring(tree)
        if not docstring:
            problems.append(f"{relative}: no module docstring (its first sentence is its "
                            "entry in docs/architecture.md)")
            continue
        sentence = first_sentence(docstring)
        if len(sentence) > MAX_SENTENCE:
            problems.append(f"{relative}: the docstring's first sentence has {len(sentence)} "
                            f"characters, more than {MAX_SENTENCE}: make it a summary")
        modules.append(Module(relative, sentence, tree))
    return modules, problems


def _shown_path(path: str) -> str:
    return path[: -len("__init__.py")] if path.endswith("/__init__.py") else path


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] + "/"


def modules_table(modules: list[Module]) -> str:
    """One Markdown table per folder: a package's own entry first, then its modules."""
    folders: dict[str, list[Module]] = {}
    for module in modules:
        folders.setdefault(_folder(module.path), []).append(module)
    parts: list[str] = []
    for folder in sorted(folders, key=lambda f: (FOLDERS.index(f.split("/")[0]), f)):
        rows = sorted(folders[folder], key=lambda m: (not m.path.endswith("/__init__.py"),
                                                      m.path))
        lines = [f"#### {folder}", "", "| module | what it does |", "| --- | --- |"]
        lines += [f"| `{_shown_path(m.path)}` | {m.sentence} |" for m in rows]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def errors_table(modules: list[Module]) -> str:
    """Every subclass of ``OcistageError`` defined in the product, by module, with its bases."""
    defined: list[tuple[str, str, list[str]]] = []  # (module path, class, base names)
    for module in modules:
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else
                         b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
                defined.append((module.path, node.name, bases))
    hierarchy = {BASE_ERROR}
    grew = True
    while grew:
        grew = False
        for _path, name, bases in defined:
            if name not in hierarchy and hierarchy.intersection(bases):
                hierarchy.add(name)
                grew = True
    lines = ["| module | error | subclass of |", "| --- | --- | --- |"]
    for path, name, bases in defined:
        if name in hierarchy:
            shown = ", ".join(f"`{b}`" for b in bases if b in hierarchy) or "`Exception`"
            lines.append(f"| `{path}` | `{name}` | {shown} |")
    return "\n".join(lines)


def render(text: str, generated: dict[str, str]) -> str:
    """``text`` with each generated part replaced; a missing marker is an error."""
    for name, body in generated.items():
        begin, end = f"<!-- generated: {name} -->", f"<!-- end generated: {name} -->"
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
        found = pattern.search(text)
        if found is None:
            raise SystemExit(f"docs/architecture.md: no '{begin}' ... '{end}' markers")
        text = f"{text[:found.start()]}{begin}\n{body}\n{end}{text[found.end():]}"
    return text


def generate() -> tuple[str, str, list[str]]:
    """(the current text, the text it should be, the docstring problems)."""
    modules, problems = read_modules()
    current = DOC.read_text(encoding="utf-8")
    wanted = render(current, {"modules": modules_table(modules),
                              "errors": errors_table(modules)})
    return current, wanted, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only report whether docs/architecture.md is up to date")
    args = parser.parse_args(argv)
    current, wanted, problems = generate()
    for problem in problems:
        print(problem, file=sys.stderr)
    if args.check:
        if current != wanted:
            sys.stdout.writelines(difflib.unified_diff(
                current.splitlines(keepends=True), wanted.splitlines(keepends=True),
                "docs/architecture.md", "docs/architecture.md (generated)"))
            print("docs/architecture.md is out of date: run `make docs`", file=sys.stderr)
            return 1
        return 1 if problems else 0
    if current != wanted:
        DOC.write_text(wanted, encoding="utf-8")
        print("rewrote docs/architecture.md")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
