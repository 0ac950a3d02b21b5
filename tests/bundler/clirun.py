"""Run the ``ocistage`` command line in this process, with a private cache and config."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ocistage.bundler import settings
from ocistage.bundler.cli.app import run
from pytest_ocistage.components import Outcome


@dataclass(frozen=True)
class Cli:
    """``cli("cache", "ls")`` runs ``ocistage cache ls`` through
    :func:`ocistage.bundler.cli.app.run`."""

    capsys: pytest.CaptureFixture[str]
    root: Path

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    def __call__(self, *argv: str) -> Outcome:
        self.capsys.readouterr()
        code = run(list(argv))
        out, err = self.capsys.readouterr()
        return Outcome(code, out, err)


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Cli]:
    root = tmp_path / "cli"
    root.mkdir()
    for name in ("OCISTAGE_PULL", "OCISTAGE_MAX_SIZE", "OCISTAGE_STAGE_TO", "OCISTAGE_UNPACK_LIMIT",
                 "OCISTAGE_INSECURE_REGISTRIES", "SLURM_JOB_ID", "REGISTRY_AUTH_FILE",
                 "DOCKER_CONFIG", "OCISTAGE_CA_FILE", "OCISTAGE_PYXIS_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OCISTAGE_CACHE", str(root / "cache"))
    monkeypatch.setenv("OCISTAGE_CONFIG", str(root / "config.toml"))
    monkeypatch.setattr(settings, "SITE_CONFIG", root / "site.toml")
    monkeypatch.setenv("HOME", str(root))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(root / ".config"))
    (root / "run").mkdir(mode=0o700)  # a login session's /run/user/UID: ocistage bundle, run by
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(root / "run"))  # a user, warns without one
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.chdir(root)
    yield Cli(capsys, root)
