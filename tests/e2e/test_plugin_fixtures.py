"""The plugin's runner, registries and its skip-or-fail rule, as a user's test suite sees them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_ocistage.components import Registry, http_status
from pytest_ocistage.plugin import ImageFactory
from pytest_ocistage.runner import OcistageRunner


def test_in_process_runs_give_exit_codes_and_streams(ocistage: OcistageRunner) -> None:
    environ, cwd, argv = dict(os.environ), os.getcwd(), list(sys.argv)
    helped = ocistage("--help")
    assert helped.exit_code == 0 and helped.stdout.startswith("Usage: ocistage ")
    assert ocistage.run_process("--help").stdout == helped.stdout
    usage = ocistage("pull")
    assert usage.exit_code == 2 and "REF" in usage.stderr
    missing = ocistage("pull", f"oci:{ocistage.cwd / 'nowhere'}:latest")
    assert missing.exit_code == 1 and missing.stderr.startswith("error: ")
    assert (dict(os.environ), os.getcwd(), sys.argv) == (environ, cwd, argv)


def test_the_runner_isolates_home_and_cache(ocistage: OcistageRunner, ocistage_cache: Path,
                                            oci_image: ImageFactory) -> None:
    image = oci_image({"f": "x"}, cmd=["/f"])
    report = ocistage("pull", "--json", image.ref, env={"HOME": "/nonexistent"}, check=True)
    assert report.json["cache"] == str(ocistage_cache)
    assert (ocistage_cache / "index.json").is_file()
    assert ocistage.environment()["HOME"] == str(ocistage.home)
    assert not any(key.startswith("OCISTAGE_") and key != "OCISTAGE_CACHE"
                   for key in ocistage.environment({"X": "1"}))


def test_registry_factory_starts_private_registries(
        oci_registry_factory: Callable[..., Registry], oci_image: ImageFactory,
        ocistage: OcistageRunner) -> None:
    tls = oci_registry_factory(tls=True, username="alice", password="secret-a")
    assert tls.url.startswith("https://") and tls.ca_file is not None
    assert http_status(f"{tls.url}/v2/", tls.ssl_context()) == 401
    pushed = oci_image({"f": "x"}, cmd=["/f"]).push(tls, "team/app")
    ocistage.write_docker_auth(tls)
    ocistage("pull", "--ca-file", str(tls.ca_file), pushed.ref, check=True)


PROBE = """
def test_needs_a_registry(oci_registry):
    pass
"""


def run_user_suite(tmp_path: Path, *options: str,
                   extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """pytest on a one-test project outside this repository, without docker-registry on PATH."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "test_probe.py").write_text(PROBE)
    (project / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "OCISTAGE_REQUIRE_E2E"}
    env.update({"PATH": str(tmp_path / "empty-bin"), **(extra_env or {})})
    return subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider",
                           *options], cwd=project, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_missing_registry_binary_skips_naming_the_debian_package(tmp_path: Path) -> None:
    result = run_user_suite(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert "install the Debian package docker-registry" in result.stdout


@pytest.mark.parametrize("strict", [("--ocistage-require",), ()])
def test_a_missing_registry_binary_fails_when_components_are_required(
        tmp_path: Path, strict: tuple[str, ...]) -> None:
    result = run_user_suite(tmp_path, *strict,
                            extra_env={} if strict else {"OCISTAGE_REQUIRE_E2E": "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 error" in result.stdout or "1 failed" in result.stdout
    assert "docker-registry not found on PATH" in result.stdout
