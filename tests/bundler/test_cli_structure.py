"""The CLI's shape: shared options declared once, settings built one way, groups attached one
way (issue 15.3). A declaration copied into a command module, a second way to build settings
or a group attached by hand fails here."""

from __future__ import annotations

import re
from pathlib import Path

BUNDLER = Path(__file__).resolve().parents[2] / "bundler"
SHARED = ("--cache", "--platform", "--insecure-registry", "--mirror", "--ca-file", "--pull",
          "--json", "--quiet", "--verbose")
# the same name with another meaning, each for a reason
OWN_MEANING = {
    ("cli_cache.py", "--platform"),  # cache rm: only this platform's entry, default all
    ("cli_slurm.py", "--cache"),     # runtime scrun-lua: a path written into the Lua, as
                                     # the nodes see it, not this host's cache
}


def _modules() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(BUNDLER.glob("cli*.py"))}


def test_shared_options_are_declared_once() -> None:
    for option in SHARED:
        where = [name for name, text in _modules().items()
                 for _ in re.finditer(rf'typer\.Option\(\s*"{re.escape(option)}"', text)
                 if (name, option) not in OWN_MEANING]
        assert where == ["cli_common.py"], (option, where)


def test_settings_are_built_one_way() -> None:
    for name, text in _modules().items():
        if name != "cli_common.py":
            assert "load_settings(" not in text, name
    assert "def settings_from" not in _modules()["cli_common.py"]


def test_groups_and_command_modules_attach_themselves() -> None:
    modules = _modules()
    assert "add_typer" not in modules["cli.py"]
    for name in ("cli_cache.py", "cli_config.py", "cli_slurm.py", "cli_stage.py"):
        assert "def register(app: typer.Typer) -> None:" in modules[name], name
        assert name.removesuffix(".py") in modules["cli.py"]
