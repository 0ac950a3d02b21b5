"""``--map-self`` (issue 34 item 3): the process runs as the caller's own uid/gid inside the
container, an identity mapping, which Slurm's PMIx server accepts from an MPI rank."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ocistage.errors import UsageError
from ocistage.runtimes.pmix_ids import pmix_credential_problem
from tests.bundler.test_runtime_config import ROOT_OPTS, build, rootfs  # noqa: F401


def test_map_self_runs_as_the_callers_ids_with_an_identity_mapping(
        rootfs: Path) -> None:  # noqa: F811
    config = build(rootfs, replace(ROOT_OPTS, map_self=True), User="app")
    assert config["process"]["user"] == {"uid": 1234, "gid": 5678}
    assert config["linux"]["uidMappings"] == [{"containerID": 1234, "hostID": 1234, "size": 1}]
    assert config["linux"]["gidMappings"] == [{"containerID": 5678, "hostID": 5678, "size": 1}]
    assert "HOME=/home/app" in config["process"]["env"]
    assert pmix_credential_problem(config) is None


def test_map_root_and_the_image_user_are_what_pmix_refuses(rootfs: Path) -> None:  # noqa: F811
    assert pmix_credential_problem(build(rootfs, replace(ROOT_OPTS, map_root=True))) is not None
    assert pmix_credential_problem(build(rootfs, ROOT_OPTS, User="app")) is not None


def test_map_self_and_map_root_exclude_each_other(rootfs: Path) -> None:  # noqa: F811
    with pytest.raises(UsageError, match="exclude each other"):
        build(rootfs, replace(ROOT_OPTS, map_root=True, map_self=True))
