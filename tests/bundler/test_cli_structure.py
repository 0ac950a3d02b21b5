"""The CLI's shape: shared options declared once, settings built one way, groups attached one
way (issue 15.3; since issue 16 through the lazy command table, ocistage.bundler.cli.commands),
results printed one way (issue 24: every command takes the shared options as one group,
``with_options``, and prints what the library returned through ``CommonOptions.emit``: the
result's ``to_json`` or ``render``). A declaration copied into a command module, a second way
to build settings or to print JSON, or a command attached by hand fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from ocistage.bundler.cli.common import CommonOptions, with_options

CLI = Path(__file__).resolve().parents[2] / "bundler" / "cli"
SHARED = ("--cache", "--platform", "--insecure-registry", "--mirror", "--ca-file", "--pull",
          "--policy", "--registries.d", "--json", "--quiet", "--verbose")
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


def test_commands_take_the_shared_options_as_one_group() -> None:
    """No command module names a shared option's type: each takes them through
    ``with_options`` and reads them from the one ``CommonOptions`` it is handed."""
    aliases = re.findall(r"^(\w+Opt) = Annotated", _modules()["common.py"], re.MULTILINE)
    assert len(aliases) >= len(SHARED)
    for name, text in _modules().items():
        if name != "common.py":
            used = [alias for alias in aliases if re.search(rf"\b{alias}\b", text)]
            assert used == [], (name, used)


def test_settings_are_built_one_way() -> None:
    for name, text in _modules().items():
        if name != "common.py":
            assert "load_settings(" not in text, name
            assert "setup_logging(" not in text, name  # with_options does, for --verbose
    common = _modules()["common.py"]
    assert "def settings_from" not in common
    assert common.count("load_settings(") == 1


def test_results_are_printed_one_way() -> None:
    """A command prints its result with ``opts.emit`` (or ``print_json_line`` for the scrun
    hooks): JSON comes from the result's ``to_json``, never from a dict a command builds."""
    from ocistage.bundler.cli.commands import COMMANDS

    modules = _modules()
    for module in {entry.module for entry in COMMANDS.values()}:
        name = module.removeprefix("ocistage.bundler.cli.") + ".py"
        text = modules[name]
        for pattern in (r"print_json\(", r"json\.dumps", r"asdict\(", r"sys\.stdout\.write\(",
                        r"def _\w+_json\("):
            assert not re.search(pattern, text), (name, pattern)


def _click_commands() -> list[tuple[str, object]]:
    from ocistage.bundler.cli.commands import COMMANDS, load_command

    found: list[tuple[str, object]] = []
    for name, entry in COMMANDS.items():
        command = load_command(name)
        if entry.group:
            found += [(f"{name} {sub}", command.commands[sub]) for sub in command.commands]
        else:
            found.append((name, command))
    return found


def test_shared_options_come_last_in_one_order() -> None:
    """Every command lists the shared options it takes after its own and in one order (that of
    --help so far), each one as common.py declares it."""
    from ocistage.bundler.cli import common

    app = typer.Typer(add_completion=False)

    @app.command()
    @with_options(*common._OPTIONS)
    def every(opts: CommonOptions) -> None:
        """Takes them all."""

    order = [p.opts[0] for p in typer.main.get_command(app).params]
    assert sorted(order) == sorted([*SHARED, "--jobs"])
    seen = set()
    for name, command in _click_commands():
        declared = [p.opts[0] for p in command.params]  # type: ignore[attr-defined]
        module = command.callback.__module__.rsplit(".", 1)[-1] + ".py"  # type: ignore[attr-defined]
        shared = [o for o in declared if o in order and (module, o) not in OWN_MEANING
                  and not (o == "--jobs" and name in ("stage", "cache verify"))]
        assert shared == declared[len(declared) - len(shared):], name  # after its own
        assert shared == sorted(shared, key=order.index), name
        seen |= set(shared)
    assert seen == set(order)


def test_with_options_hands_the_command_one_object() -> None:
    from typer.testing import CliRunner

    app = typer.Typer()
    got: list[tuple[str, CommonOptions]] = []

    @app.command()
    @with_options("cache", "mirror", "pull", "json")
    def command(name: str, opts: CommonOptions) -> None:
        got.append((name, opts))

    result = CliRunner().invoke(app, ["x", "--mirror", "a=b", "--mirror", "c=d", "--json",
                                      "--pull", "never"])
    assert result.exit_code == 0, result.output
    assert got == [("x", CommonOptions(mirror=("a=b", "c=d"), pull="never", json=True))]
    result = CliRunner().invoke(app, ["x", "--quiet"])  # not one of its options
    assert result.exit_code == 2
    with pytest.raises(TypeError, match="opts"):
        with_options("cache")(lambda name: None)
    with pytest.raises(ValueError, match="nonsense"):
        with_options("nonsense")


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
