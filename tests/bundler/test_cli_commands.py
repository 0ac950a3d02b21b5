"""The lazy command table (bundler.cli_commands): what ``ocistage --help`` lists without loading
a command is what each command says of itself once loaded."""

from __future__ import annotations

import pytest

from bundler.cli import run
from bundler.cli_commands import COMMANDS, LazyGroup, load_command, shorten


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_summary_is_the_commands_own(name: str) -> None:
    command = load_command(name)
    assert command.name == name
    assert command.get_short_help_str(10_000) == COMMANDS[name].summary
    assert hasattr(command, "list_commands") == COMMANDS[name].group


def test_help_lists_every_command_in_the_tables_order(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.split("Commands:")[1].splitlines()
              if line.startswith("  ")]
    assert listed == list(COMMANDS)


def test_the_group_builds_a_command_once_when_it_is_looked_up() -> None:
    group = LazyGroup(name="ocistage")
    assert group.commands == {}
    first = group.get_command(None, "cache")
    assert group.get_command(None, "cache") is first
    assert list(group.commands) == ["cache"]
    assert group.get_command(None, "nosuch") is None


@pytest.mark.parametrize(("text", "limit", "expected"), [
    ("short", 10, "short"),
    ("Make a rootless bundle from an image.", 20, "Make a rootless..."),
    ("one, two, three", 12, "one, two..."),
    ("nospaces-at-all", 8, "nospa..."),
])
def test_shorten_cuts_at_a_word(text: str, limit: int, expected: str) -> None:
    assert shorten(text, limit) == expected
    assert len(shorten(text, limit)) <= max(limit, 3)
