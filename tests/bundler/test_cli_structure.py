"""The CLI's shape: shared options declared once, settings built one way, groups attached one
way (issue 15.3; since issue 16 through the lazy command table, ocistage.bundler.cli.commands). A
declaration copied into a command module, a second way to build settings or a command attached
by hand fails here."""

from __future__ import annotations

import re
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "bundler" / "cli"
SHARED = ("--cache", "--platform", "--insecure-registry", "--mirror", "--ca-file", "--pull",
          "--json", "--quiet", "--verbose")
# the same name with another meaning, each for a reason
OWN_MEANING = {
    ("cache.py", "--platform"),  # cache rm: only this platform's entry, default all
    ("slurm.py", "--cache"),     # runtime scrun-lua: a path written into the Lua, as
                                     # the nodes see it, not this host's cache
}


def _modules() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(CLI.glob("*.py"))}


def test_shared_options_are_declared_once() -> None:
    for option in SHARED:
        where = [name for name, text in _modules().items()
                 for _ in re.finditer(rf'typer\.Option\(\s*"{re.escape(option)}"', text)
                 if (name, option) not in OWN_MEANING]
        assert where == ["common.py"], (option, where)


def test_settings_are_built_one_way() -> None:
    for name, text in _modules().items():
        if name != "common.py":
            assert "load_settings(" not in text, name
    assert "def settings_from" not in _modules()["common.py"]


def test_commands_are_attached_one_way() -> None:
    """Every top-level command is an entry of ocistage.bundler.cli.commands.COMMANDS, naming a
    ``typer.Typer`` of its module; nothing attaches commands by hand."""
    import typer

    from ocistage.bundler.cli.commands import COMMANDS

    modules = _modules()
    for name, text in modules.items():
        assert "add_typer" not in text, name
        assert "def register(" not in text, name
    command_modules = {entry.module for entry in COMMANDS.values()}
    assert not any(re.search(rf"^\s*(from|import) {re.escape(module)}\b", modules["app.py"],
                             re.MULTILINE) for module in command_modules)  # app.py imports none
    for name, entry in COMMANDS.items():
        module = entry.module.removeprefix("ocistage.bundler.cli.") + ".py"
        assert f'{entry.app} = typer.Typer(' in modules[module], (name, entry)
        import importlib

        assert isinstance(getattr(importlib.import_module(entry.module), entry.app),
                          typer.Typer), name
