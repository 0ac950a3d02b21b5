"""The layer tests run twice: with the fast tar header parser (tarfile internals) and with
tarfile's public parser, the fallback chosen when the internals are missing or changed. Both
must give the trees the tests expect, hence the same trees."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator

import pytest

from ocistage.bundler.unpack import apply as applier
from ocistage.bundler.unpack import tarstream

BOTH_PARSERS = ("test_layers", "test_layers_hostile", "test_layers_model", "test_layer_tar",
                "test_sparse")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.module.__name__.rpartition(".")[2] in BOTH_PARSERS:
        metafunc.fixturenames.append("tar_parser")
        metafunc.parametrize("tar_parser", ["fast", "public"], indirect=True, scope="module")


@pytest.fixture(scope="module")
def tar_parser(request: pytest.FixtureRequest) -> Iterator[str]:
    chosen: type[tarfile.TarInfo] = (tarstream.tarinfo_class() if request.param == "fast"
                                     else tarfile.TarInfo)
    if request.param == "fast":
        assert chosen is tarstream._TarInfo, "this Python's tarfile lost the fast path"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(applier, "tarinfo_class", lambda: chosen)
        yield request.param


@pytest.fixture(autouse=True)
def no_machine_image_policy(tmp_path_factory: pytest.TempPathFactory,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit tests never read this machine's /etc/containers (a site policy there would
    judge their images): its place is taken by a path that does not exist."""
    from ocistage.bundler.trust import files

    missing = tmp_path_factory.getbasetemp() / "no-etc-containers"
    monkeypatch.setattr(files, "SYSTEM_POLICY", missing / "policy.json")
    monkeypatch.setattr(files, "SYSTEM_REGISTRIES_D", missing / "registries.d")
