"""Settings: the default stage target, ``stage_to`` — --to > $OCISTAGE_STAGE_TO > user file >
site file — in the library and through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ocistage.bundler import settings
from ocistage.bundler.settings import load_settings
from ocistage.errors import UsageError


@pytest.fixture
def config_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(site file, user file), both absent until a test writes them; no env overrides."""
    site, user = tmp_path / "site.toml", tmp_path / "user.toml"
    monkeypatch.setattr(settings, "SITE_CONFIG", site)
    monkeypatch.setenv("OCISTAGE_CONFIG", str(user))
    monkeypatch.delenv("OCISTAGE_STAGE_TO", raising=False)
    return site, user


def test_stage_to_precedence_env_over_user_over_site(config_files: tuple[Path, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    site, user = config_files
    assert load_settings().stage_to is None
    site.write_text('stage_to = "/scratch/site"\n')
    assert load_settings().stage_to == "/scratch/site"
    user.write_text('stage_to = "/scratch/user"\n')
    assert load_settings().stage_to == "/scratch/user"
    monkeypatch.setenv("OCISTAGE_STAGE_TO", "/scratch/env")
    assert load_settings().stage_to == "/scratch/env"


def test_stage_to_expands_home_but_keeps_urls(config_files: tuple[Path, Path]) -> None:
    _site, user = config_files
    user.write_text('stage_to = "~/bundles"\n')
    assert load_settings().stage_to == os.path.expanduser("~/bundles")
    user.write_text('stage_to = "file:///scratch/images"\n')
    assert load_settings().stage_to == "file:///scratch/images"


def test_stage_to_must_be_a_string(config_files: tuple[Path, Path]) -> None:
    _site, user = config_files
    user.write_text("stage_to = 5\n")
    with pytest.raises(UsageError, match="stage_to"):
        load_settings()


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ocistage", *args],
                          env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False)


def test_stage_without_to_uses_the_config_file_then_the_option(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "file").write_text("data\n")
    config = tmp_path / "config.toml"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OCISTAGE_", "SLURM_"))}
    env.update({"OCISTAGE_CONFIG": str(config), "OCISTAGE_CACHE": str(tmp_path / "cache"),
                "HOME": str(tmp_path), "NO_COLOR": "1"})
    missing = _cli("stage", str(tree), env=env)
    assert missing.returncode == 2 and "no stage target" in missing.stderr
    assert "stage_to" in missing.stderr
    config.write_text(f'stage_to = "{tmp_path / "from-config"}"\n')
    out = _cli("stage", str(tree), "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["path"] == str(tmp_path / "from-config" / "tree")
    out = _cli("stage", str(tree), "--to", str(tmp_path / "from-option"), "--json",
               env={**env, "OCISTAGE_STAGE_TO": str(tmp_path / "from-env")})
    assert json.loads(out.stdout)["path"] == str(tmp_path / "from-option" / "tree")
    out = _cli("stage", str(tree), "--json",
               env={**env, "OCISTAGE_STAGE_TO": str(tmp_path / "from-env")})
    assert json.loads(out.stdout)["path"] == str(tmp_path / "from-env" / "tree")


@pytest.mark.parametrize("text", ["127.0.0.1:99999", "reg.example:0", "a b", "host:port",
                                  "reg.example/ns"])
def test_an_insecure_registry_that_is_not_one_is_refused(
        text: str, config_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo in an insecure registry (a port out of range) must not pass unnoticed: TLS would
    stay on for the registry meant, or off for one never meant."""
    with pytest.raises(UsageError, match="--insecure-registry"):
        load_settings(insecure=[text])
    monkeypatch.setenv("OCISTAGE_INSECURE_REGISTRIES", f"localhost:5000,{text}")
    with pytest.raises(UsageError, match="OCISTAGE_INSECURE_REGISTRIES"):
        load_settings()
    monkeypatch.setenv("OCISTAGE_INSECURE_REGISTRIES", "localhost:5000, [::1]:443,")
    assert load_settings(insecure=["reg.example:65535"]).insecure_registries == {
        "localhost:5000", "[::1]:443", "reg.example:65535"}


def test_pyxis_squashfs_only_env_over_user_over_site(config_files: tuple[Path, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    site, user = config_files
    monkeypatch.delenv("OCISTAGE_PYXIS_SQUASHFS_ONLY", raising=False)
    assert load_settings().pyxis_squashfs_only is False
    site.write_text("pyxis_squashfs_only = true\n")
    chosen = load_settings()
    assert chosen.pyxis_squashfs_only is True
    assert chosen.origins["pyxis_squashfs_only"] == f"file {site}"
    user.write_text("pyxis_squashfs_only = false\n")
    assert load_settings().pyxis_squashfs_only is False
    for word, value in (("1", True), ("yes", True), ("TRUE", True), ("0", False), ("no", False)):
        monkeypatch.setenv("OCISTAGE_PYXIS_SQUASHFS_ONLY", word)
        assert load_settings().pyxis_squashfs_only is value, word
    monkeypatch.setenv("OCISTAGE_PYXIS_SQUASHFS_ONLY", "sometimes")
    with pytest.raises(UsageError, match="OCISTAGE_PYXIS_SQUASHFS_ONLY"):
        load_settings()
    monkeypatch.delenv("OCISTAGE_PYXIS_SQUASHFS_ONLY")
    user.write_text('pyxis_squashfs_only = "yes"\n')
    with pytest.raises(UsageError, match="pyxis_squashfs_only"):
        load_settings()


def test_pyxis_compression_env_over_user_over_site(config_files: tuple[Path, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The compression of the importer's new images: the file's value is checked as it is
    read (a compressor mksquashfs knows, a level in its range); the variable's by the importer
    before it pulls (tests/e2e/test_pyxis_store.py)."""
    site, user = config_files
    monkeypatch.delenv("OCISTAGE_PYXIS_COMPRESSION", raising=False)
    assert load_settings().pyxis_compression is None
    site.write_text('pyxis_compression = "zstd:3"\n')
    assert load_settings().pyxis_compression == "zstd:3"
    user.write_text('pyxis_compression = "lz4"\n')
    chosen = load_settings()
    assert chosen.pyxis_compression == "lz4"
    assert chosen.origins["pyxis_compression"] == f"file {user}"
    monkeypatch.setenv("OCISTAGE_PYXIS_COMPRESSION", "gzip:9")
    assert load_settings().pyxis_compression == "gzip:9"
    monkeypatch.delenv("OCISTAGE_PYXIS_COMPRESSION")
    for bad in ('"zstd:23"', '"lz4:1"', '"zstd -Xhc"', "6", "true"):
        user.write_text(f"pyxis_compression = {bad}\n")
        with pytest.raises(UsageError, match="pyxis_compression"):
            load_settings()
