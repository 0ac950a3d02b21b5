"""The project's end-to-end tests: the ocistage pytest plugin's fixtures plus fixture images.

The registries, the fault proxy and the ``ocistage`` runner are the plugin's
(pytest_ocistage/plugin.py, docs/testing.md): one set of fixtures for this project and its
users. This conftest marks every test here ``e2e``, prints the component versions, gives the
plugin's registries the names these tests use and pushes the project's fixture images.

- ``plain_registry``     ``oci_registry``: anonymous, plain HTTP
- ``tls_registry``       ``oci_registry_tls``: HTTPS with a private CA (``ca_file``, ``cert_dir``)
- ``htpasswd_registry``  ``oci_registry_basic_auth``: basic auth, plain HTTP
- ``token_issuer`` and ``token_registry``: ``oci_token_issuer``/``oci_registry_token``;
  ``public/*`` repositories can be pulled anonymously, everything else needs
  ``TOKEN_USER``/``TOKEN_PASSWORD``
- ``fixture_layouts_built`` the OCI layout with the fixture images (cached across sessions)
- ``images``             name -> :class:`~pytest_ocistage.images.ImageRef` of every pushed image

The Slurm clusters (``slurm_22_05``, ``slurm_24_05``, ``slurm_cluster``, ``shared_dir``,
``slurm_job_user``) are the plugin's too (pytest_ocistage/slurm.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ocistage.components import Registry, e2e_required, require_binary
from pytest_ocistage.images import (
    FixtureLayouts,
    ImageRef,
    PushSpec,
    cache_root,
    fixture_layouts,
    push_all,
)
from pytest_ocistage.plugin import BASIC_PASSWORD as HTPASSWD_PASSWORD
from pytest_ocistage.plugin import BASIC_USER as HTPASSWD_USER
from pytest_ocistage.plugin import TOKEN_PASSWORD, TOKEN_USER
from pytest_ocistage.runner import OcistageRunner, ocistage_command
from pytest_ocistage.tokenissuer import TokenIssuer
from tests.procs import running

__all__ = ["HTPASSWD_PASSWORD", "HTPASSWD_USER", "TOKEN_PASSWORD", "TOKEN_USER",
           "OcistageRunner", "ocistage_command", "require_binary"]

_E2E_DIR = Path(__file__).parent


def pytest_report_header() -> list[str]:
    """Which real components this run uses, so a CI log says what was tested against."""
    versions = []
    for argv in (["docker-registry", "--version"], ["skopeo", "--version"],
                 ["umoci", "--version"], ["runc", "--version"], ["crun", "--version"]):
        if shutil.which(argv[0]) is None:
            versions.append(f"{argv[0]}: missing")
            continue
        result = subprocess.run(argv, capture_output=True, text=True, timeout=10,
                                stdin=subprocess.DEVNULL, check=False)
        first = (result.stdout or result.stderr).strip().splitlines()
        versions.append(first[0] if first else f"{argv[0]}: ?")
    required = "required" if e2e_required() else "optional: tests needing a missing one skip"
    return [f"e2e components [{required}]: " + "; ".join(versions),
            f"e2e fixture image cache: {cache_root()}"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _E2E_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


# --- the plugin's registries under this project's names -------------------------------------

@pytest.fixture(scope="session")
def plain_registry(oci_registry: Registry) -> Registry:
    return oci_registry


@pytest.fixture(scope="session")
def tls_registry(oci_registry_tls: Registry) -> Registry:
    return oci_registry_tls


@pytest.fixture(scope="session")
def htpasswd_registry(oci_registry_basic_auth: Registry) -> Registry:
    return oci_registry_basic_auth


@pytest.fixture(scope="session")
def token_issuer(oci_token_issuer: TokenIssuer) -> TokenIssuer:
    return oci_token_issuer


@pytest.fixture(scope="session")
def token_registry(oci_registry_token: Registry) -> Registry:
    return oci_registry_token


# --- images -----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def fixture_layouts_built() -> FixtureLayouts:
    require_binary("umoci")
    require_binary("skopeo")
    return fixture_layouts()


@pytest.fixture(scope="session")
def images(fixture_layouts_built: FixtureLayouts, ocistage_session_dir: Path,
           plain_registry: Registry,
           tls_registry: Registry, htpasswd_registry: Registry,
           token_registry: Registry) -> dict[str, ImageRef]:
    """Every fixture image pushed where tests expect it, by name:

    ``busybox``, ``busybox-zstd``, ``busybox-v2s2``, ``multilayer``, ``multilayer-zstd``,
    ``multiarch`` (OCI index), ``multiarch-v2s2`` (Docker manifest list) (plain registry);
    ``tls/busybox``; ``htpasswd/busybox``;
    ``token/public`` (``public/busybox``) and ``token/private`` (``private/busybox``).
    """
    require_binary("skopeo")
    specs = [
        PushSpec("busybox", "busybox", plain_registry, "busybox"),
        PushSpec("busybox-zstd", "busybox-zstd", plain_registry, "busybox", "zstd"),
        PushSpec("busybox-v2s2", "busybox", plain_registry, "busybox", "v2s2",
                 ("--format", "v2s2")),
        PushSpec("multilayer", "multilayer", plain_registry, "multilayer"),
        PushSpec("multilayer-zstd", "multilayer-zstd", plain_registry, "multilayer",
                 "zstd"),
        PushSpec("multiarch", "multiarch", plain_registry, "multiarch"),
        PushSpec("multiarch-v2s2", "multiarch", plain_registry, "multiarch", "v2s2",
                 ("--format", "v2s2")),
        PushSpec("tls/busybox", "busybox", tls_registry, "busybox"),
        PushSpec("htpasswd/busybox", "busybox", htpasswd_registry, "private/busybox"),
        PushSpec("token/public", "busybox", token_registry, "public/busybox"),
        PushSpec("token/private", "busybox", token_registry, "private/busybox"),
    ]
    return push_all(specs, fixture_layouts_built, ocistage_session_dir / "push")


@pytest.fixture
def survivors() -> Iterator[list[int]]:
    """Pids a test saw; any still running at its end is killed (the test has failed then)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
