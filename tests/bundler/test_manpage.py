"""``make man``: ocistage(1) built from the commands' own help, every command in it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from ocistage.bundler.cli.app import app
from ocistage.bundler.cli.manpage import commands, help_text
from pytest_ocistage.components import require_binary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_binary("make")
    man_dir = tmp_path_factory.mktemp("man") / "man1"
    subprocess.run(["make", "-s", "-C", str(ROOT), "man", f"MAN_DIR={man_dir}",
                    f"MAN_PYTHON={sys.executable}"], check=True, capture_output=True,
                   timeout=120)
    return man_dir / "ocistage.1"


def test_make_man_lists_every_command_with_its_help(page: Path) -> None:
    text = page.read_text()
    assert text.startswith(".TH OCISTAGE 1 ")
    root = typer.main.get_command(app)
    found = list(commands(root))
    assert {words[0] for words, _ in found} == set(root.list_commands(None))
    assert ("cache", "gc") in {words for words, _ in found}
    for words, command in found:
        assert f".SS ocistage {' '.join(words)}\n" in text, words
        usage = help_text(command, words).splitlines()[0]
        assert usage.startswith(f"Usage: ocistage {' '.join(words)}")
        assert usage in text
    assert ".SH EXIT STATUS" in text and "141" in text


def test_man_reads_it(page: Path) -> None:
    require_binary("man")
    shown = subprocess.run(["man", "--warnings", "-l", str(page)], capture_output=True,
                           text=True, timeout=60, check=True,
                           env={**os.environ, "MANWIDTH": "100", "MANPAGER": "cat"})
    assert "ocistage cache gc" in shown.stdout and "Examples:" in shown.stdout
    assert shown.stderr == ""  # groff found nothing to warn about


def test_make_man_writes_the_importers_page(page: Path) -> None:
    """Issue 38: ocistage-pyxis-importer, which pyxis runs for every user, has a page of its
    own, which man reads without a warning, and ocistage(1) points to it."""
    from ocistage.bundler.pyxis.main import USAGE

    importer = page.parent / "ocistage-pyxis-importer.1"
    text = importer.read_text()
    assert text.startswith(".TH OCISTAGE-PYXIS-IMPORTER 1 ")
    assert ".BR ocistage-pyxis-importer (1)" in page.read_text()
    require_binary("man")
    shown = subprocess.run(["man", "--warnings", "-l", str(importer)], capture_output=True,
                           text=True, timeout=60, check=True,
                           env={**os.environ, "MANWIDTH": "200", "MANPAGER": "cat"})
    assert shown.stderr == ""
    for line in USAGE.splitlines():  # the importer's own usage, command by command
        assert line.replace("usage: ", "").strip() in shown.stdout
    for name in ("OCISTAGE_CACHE", "OCISTAGE_PYXIS_STORE", "OCISTAGE_PULL", "SLURM_JOB_ID",
                 "plugstack.conf", "EXIT STATUS"):
        assert name in shown.stdout, name
