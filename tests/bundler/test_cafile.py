"""The CA file check (bundler/registry/cafile.py): what is refused, and how it is named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocistage.bundler.registry.cafile import CA_FILE_LIMIT, check_ca_file
from ocistage.bundler.registry.errors import CaFileError
from ocistage.bundler.settings import load_settings
from tests.bundler.fakeregistry import self_signed_cert


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> str:
    return self_signed_cert(tmp_path_factory.mktemp("ca"))[0]


def test_a_pem_file_is_counted(certificate: str, tmp_path: Path) -> None:
    assert check_ca_file(certificate, "option --ca-file") == 1
    both = tmp_path / "both.pem"
    text = Path(certificate).read_text()
    both.write_text(text + "\n# a comment between blocks\n" + Path(
        self_signed_cert(tmp_path)[0]).read_text())
    assert check_ca_file(str(both), "x") == 2


def test_what_is_not_a_ca_file(tmp_path: Path, certificate: str) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # refused without waiting for a writer
    big = tmp_path / "big.pem"
    with open(big, "wb") as handle:
        handle.truncate(CA_FILE_LIMIT + 1)
    for path, why in ((tmp_path, "is a directory"), (fifo, "not a regular file"),
                      (big, "larger than 16 MiB"), (tmp_path / "none", "no such file")):
        with pytest.raises(CaFileError, match=why) as ex:
            check_ca_file(str(path), "file /etc/ocistage/config.toml")
        assert f"({'file /etc/ocistage/config.toml'})" in ex.value.message


def test_the_origin_comes_from_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            certificate: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'ca_file = "{tmp_path / "missing.pem"}"\n')
    monkeypatch.setenv("OCISTAGE_CONFIG", str(config))
    monkeypatch.delenv("OCISTAGE_CA_FILE", raising=False)
    from_file = load_settings().registry_config()
    assert from_file.ca_file_origin == f"file {config}"
    monkeypatch.setenv("OCISTAGE_CA_FILE", certificate)
    from_env = load_settings().registry_config()
    assert (from_env.ca_file, from_env.ca_file_origin) == (certificate,
                                                           "environment OCISTAGE_CA_FILE")
    from_option = load_settings(ca_file=str(tmp_path)).registry_config()
    assert from_option.ca_file_origin == "option --ca-file"
    for config_of in (from_file, from_option):
        assert config_of.ca_file is not None
        with pytest.raises(CaFileError, match=config_of.ca_file_origin):
            check_ca_file(config_of.ca_file, config_of.ca_file_origin)
