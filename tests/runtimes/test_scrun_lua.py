"""The scrun.lua template, a package data file: rendered with representative and hostile
settings, every result compiles (``luac5.3 -p``) and holds each value as one string."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ocistage.runtimes.scrun_lua import (
    TEMPLATE_NAME,
    ScrunLuaOptions,
    lua_template,
    render_scrun_lua,
)
from pytest_ocistage.components import require_binary

HOSTILE = ('/p/"quoted"', "/p/]]--[[", "/p/]=]\nos.exit(3)", "/p/new\nline", "/p/back\\slash",
           "/p/@CACHE@", "/p/it's", "/p/\x00nul", "/p/caf\udce9")

SETTINGS = [
    ScrunLuaOptions(),
    ScrunLuaOptions(ocistage=("/usr/bin/env", "PYTHONPATH=/opt/o", "/usr/bin/python3", "-P",
                              "-m", "ocistage"), stage_to="node-local",
                    stage_dir="/var/tmp/ocistage-scrun", cache="/scratch/cache",
                    sbatch="/usr/bin/sbatch", slurm_json=True),
    *(ScrunLuaOptions(ocistage=(value, value), stage_dir=value, cache=value, sbatch=value)
      for value in HOSTILE),
]


def _compile(text: str, tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    luac = require_binary("luac5.3", "lua5.3")
    script = tmp_path / "scrun.lua"
    script.write_bytes(text.encode("utf-8", "surrogateescape"))
    return subprocess.run([luac, "-p", str(script)], capture_output=True, timeout=60,
                          check=False)


def test_the_template_is_package_data() -> None:
    template = lua_template()
    assert template.startswith("-- scrun.lua:")
    for marker in ("@OCISTAGE@", "@STAGE_TO@", "@STAGE_DIR@", "@CACHE@", "@SBATCH@",
                   "@JSON@"):
        assert template.count(marker) == 1, marker
    assert (Path(__file__).parents[2] / "runtimes" / TEMPLATE_NAME).read_text() == template


@pytest.mark.parametrize("options", SETTINGS, ids=range(len(SETTINGS)))
def test_every_rendering_compiles(options: ScrunLuaOptions, tmp_path: Path) -> None:
    text = render_scrun_lua(options)
    compiled = _compile(text, tmp_path)
    assert compiled.returncode == 0, compiled.stderr.decode(errors="replace")
    # each value stays inside its one string literal: no line of the template is added
    assert text.count("\n") == lua_template().count("\n")


def test_luac_refuses_what_is_not_lua(tmp_path: Path) -> None:
    """The check itself: a raw value spliced in would not compile."""
    broken = lua_template().replace("@STAGE_DIR@", '"/p"]]\nos.exit(3')
    assert _compile(broken, tmp_path).returncode != 0
