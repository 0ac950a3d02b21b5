"""The lazy command table (ocistage.bundler.cli.commands): what ``ocistage --help`` lists without
loading
a command is what each command says of itself once loaded."""

from __future__ import annotations

import pytest

from ocistage.bundler.cli.app import run
from ocistage.bundler.cli.commands import COMMANDS, LazyGroup, load_command


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
              if line.startswith("  ") and not line.startswith("   ")]  # not a wrapped summary
    assert listed == list(COMMANDS)


def test_the_group_builds_a_command_once_when_it_is_looked_up() -> None:
    group = LazyGroup(name="ocistage")
    assert group.commands == {}
    first = group.get_command(None, "cache")
    assert group.get_command(None, "cache") is first
    assert list(group.commands) == ["cache"]
    assert group.get_command(None, "nosuch") is None


def test_the_help_list_is_what_click_makes_of_the_loaded_commands() -> None:
    """The rows ``--help`` shows from the table are the ones the commands themselves give,
    without loading them: each summary in full, wrapped to the width (never cut
    mid-sentence, as click cuts them)."""
    from ocistage.bundler.cli.commands import FullSummaryGroup

    lazy = LazyGroup(name="ocistage")
    eager = FullSummaryGroup(name="ocistage",
                             commands={name: load_command(name) for name in COMMANDS})
    shown = []
    for group in (lazy, eager):
        ctx = group.make_context("ocistage", [])
        formatter = ctx.make_formatter()
        formatter.width = 60  # narrow: long summaries are wrapped
        group.format_commands(ctx, formatter)
        shown.append(formatter.getvalue())
    assert lazy.commands == {}  # listing loaded nothing
    assert shown[0] == shown[1]
    assert "..." not in shown[0]
    words = " ".join(shown[0].split()).replace("- ", "-")  # wrapped after a hyphen
    for name, entry in COMMANDS.items():
        assert f"{name} {entry.summary}" in words, name


@pytest.mark.parametrize("group", ["cache", "config", "runtime", "scrun"])
def test_groups_list_their_commands_summaries_in_full(
        group: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([group, "--help"]) == 0
    listed = " ".join(capsys.readouterr().out.split("Commands:")[1].split()).replace("- ", "-")
    command = load_command(group)
    for name in command.list_commands(None):
        summary = command.get_command(None, name).get_short_help_str(10_000)
        assert f"{name} {summary}" in listed, (group, name)


def test_submit_shows_the_job_command_in_its_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["submit", "--help"]) == 0
    assert capsys.readouterr().out.startswith(
        "Usage: ocistage submit [OPTIONS] {REF} [SBATCH OPTS] -- CMD...")


@pytest.mark.parametrize("name", ["pull", "inspect", "bundle", "stage", "unstage", "submit"])
def test_the_everyday_commands_show_examples(name: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert run([name, "--help"]) == 0
    examples = capsys.readouterr().out.split("Examples:\n")[1].splitlines()
    lines = [line.strip() for line in examples if line.strip()]
    assert lines and all(f"ocistage {name} " in line for line in lines), lines
