"""Every command's ``--json`` output has exactly the keys docs/cli.md documents, all snake_case.

The commands run in this process against an image layout and a private cache; the keys of
their output (``a.b`` for nested objects, ``a[].b`` for lists of objects) are compared with
the tables of docs/cli.md. ``submit`` needs Slurm and ``scrun stage-in`` an engine's bundle:
their JSON comes from code checked here directly.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ocistage.runtimes.scrun import StageInResult
from tests.bundler.clirun import Cli, cli
from tests.bundler.tarbuilder import build_tar, file, write_oci_layout

__all__ = ["cli"]  # the fixture

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")


def documented() -> dict[str, dict[str, str]]:
    """``{"pull": {"name": "string", "layers[].digest": "string", ...}, ...}``."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in DOCS.read_text().splitlines():
        heading = re.match(r"^### `ocistage ([a-z -]+?)(?: --json)?`", line)
        if heading:
            current = sections.setdefault(heading.group(1), {})
            continue
        if line.startswith("## "):
            current = None
        row = re.match(r"^\| `([^`]+)` \| ([^|]+) \|", line)
        if current is not None and row:
            current[row.group(1)] = row.group(2).strip()
    return sections


def keys_of(value: Any, maps: set[str], prefix: str = "") -> set[str]:
    """The dotted key paths of ``value``, not descending into documented maps."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            found.add(path)
            if path not in maps:
                found |= keys_of(item, maps, path)
    elif isinstance(value, list):
        for item in value:
            found |= keys_of(item, maps, f"{prefix}[]")
    return found


def check(command: str, output: Any, *, complete: bool = True) -> None:
    table = documented()[command]
    maps = {key for key, kind in table.items() if kind.startswith("map")}
    actual = keys_of(output, maps)
    for key in actual:
        for part in re.split(r"\.|\[\]\.?", key):
            if part:
                assert SNAKE.fullmatch(part), f"{command}: {key} is not snake_case"
    if complete:
        assert actual == set(table), f"{command}: documented {sorted(set(table) - actual)} " \
                                     f"missing; undocumented {sorted(actual - set(table))}"
    else:  # lists that were empty in this run: their element keys cannot show
        assert actual <= set(table), f"{command}: undocumented {sorted(actual - set(table))}"
        assert {k for k in table if "[]" not in k} <= actual, command


@pytest.fixture
def layout(tmp_path: Path) -> str:
    write_oci_layout(tmp_path / "layout", [build_tar([file("hello.txt", b"hello")])],
                     tag="v1", container={"Cmd": ["/hello"], "Labels": {"org.Example-Label": "x"}})
    return f"oci:{tmp_path / 'layout'}:v1"


def _json(cli: Cli, *argv: str) -> Any:
    result = cli(*argv, "--json")
    assert result.exit_code == 0, (argv, result)
    return json.loads(result.stdout)


def test_every_documented_key_is_snake_case() -> None:
    sections = documented()
    assert {"pull", "bundle", "inspect", "stage", "unstage", "cache ls", "cache du",
            "cache gc", "cache verify", "config show", "submit", "scrun stage-in",
            "scrun stage-out"} <= set(sections)
    for command, table in sections.items():
        for key in table:
            for part in re.split(r"\.|\[\]\.?", key):
                assert not part or SNAKE.fullmatch(part), f"{command}: {key}"


def test_image_commands(cli: Cli, layout: str) -> None:
    check("pull", _json(cli, "pull", layout))
    check("inspect", _json(cli, "inspect", layout), complete=False)  # one platform
    check("bundle", _json(cli, "bundle", layout))
    check("cache ls", _json(cli, "cache", "ls"), complete=False)
    check("cache du", _json(cli, "cache", "du"))
    check("cache verify", _json(cli, "cache", "verify"), complete=False)
    # `left` (another member's trees) is empty in a cache of one user: its keys cannot show
    check("cache gc", _json(cli, "cache", "gc", "--dry-run", "--max-size", "1"),
          complete=False)
    check("cache gc", _json(cli, "cache", "rm", layout), complete=False)


def test_stage_and_unstage(cli: Cli, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "file").write_text("data\n")
    staged = _json(cli, "stage", str(tree), "--to", str(tmp_path / "target"))
    check("stage", staged)
    listing = _json(cli, "cache", "ls")
    check("cache ls", listing, complete=False)
    assert listing["leases"], "the staged bundle's lease shows in cache ls"
    check("unstage", _json(cli, "unstage", staged["path"]))


def test_config_show(cli: Cli) -> None:
    cli.config.write_text('[registries."r:1"]\nmirrors = ["https://m.example"]\n')
    check("config show", _json(cli, "config", "show", "--insecure-registry", "r:2"))


def test_doctor(cli: Cli, tmp_path: Path) -> None:
    result = cli("doctor", "--json", "--to", str(tmp_path / "staged"))
    report = json.loads(result.stdout)
    check("doctor", report)
    assert result.returncode == (0 if report["ok"] else 1)
    names = [c["name"] for c in report["checks"]]
    assert {"config", "cache", "stage_target", "runc", "crun", "userns", "subuid",
            "xdg_runtime_dir", "fuse", "squashfuse", "mksquashfs", "slurm"} <= set(names)
    # docs/cli.md lists each check: "- `name` (core): ..." or "- `runc`, `crun`: ..."
    listed = re.findall(r"^- `([a-z_.]+)`(?:, `([a-z_.]+)`)?(?: \(core\))?: ",
                        DOCS.read_text(), re.MULTILINE)
    assert set(names) <= {n for pair in listed for n in pair if n}


def test_scrun_stage_in_line() -> None:
    result = StageInResult(bundle=Path("/b"), root_path=Path("/b/rootfs"),
                           config=Path("/b/config.json"), files=1, copied=1, linked=0,
                           unchanged=0, bytes_copied=1, lease_id=None, method="copy",
                           dropped=())
    check("scrun stage-in", result.to_json())


def test_scrun_stage_out_line(cli: Cli, tmp_path: Path) -> None:
    result = cli("scrun", "stage-out", "--bundle", str(tmp_path / "absent"))
    assert result.exit_code == 0, result
    check("scrun stage-out", json.loads(result.stdout))


def test_readme_links_exist_and_name_no_missing_design_file() -> None:
    """The README pointed to a DESIGN.md that is not in the repository (issue 14.10)."""
    root = DOCS.parents[1]
    readme = (root / "README.md").read_text()
    assert "DESIGN.md" not in readme
    links = re.findall(r"\]\(([^)#:]+)\)", readme)
    assert "docs/cli.md" in links and "docs/config.md" in links
    assert [link for link in links if not (root / link).exists()] == []


def test_config_show_tells_option_from_environment(cli: Cli, tmp_path: Path) -> None:
    """--cache reads $OCISTAGE_CACHE too: config show still names the environment."""
    cli.config.write_text("jobs = 3\n")
    shown = _json(cli, "config", "show")["settings"]
    assert shown["cache"] == {"value": str(cli.cache), "origin": "environment OCISTAGE_CACHE"}
    assert shown["jobs"] == {"value": 3, "origin": f"file {cli.config}"}
    assert shown["pull"] == {"value": "always", "origin": "default"}
    given = _json(cli, "config", "show", "--cache", str(tmp_path / "c"), "-j", "2")["settings"]
    assert given["cache"] == {"value": str(tmp_path / "c"), "origin": "option --cache"}
    assert given["jobs"] == {"value": 2, "origin": "option --jobs"}
    human = cli("config", "show")
    assert human.exit_code == 0
    assert re.search(r"^jobs +3 +\(file .*config\.toml\)$", human.stdout, re.MULTILINE)
