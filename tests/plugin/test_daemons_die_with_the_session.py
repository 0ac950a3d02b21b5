"""A registry a fixture starts never outlives the pytest session that started it, however the
session ends (issue 27.13): SIGKILL gives no fixture teardown a chance, so the kernel must stop
it (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_ocistage.components import REGISTRY_BINARY, require_binary
from tests.procs import children, running

INNER = '''
import time
from pathlib import Path


def test_hold_a_registry(oci_registry):
    Path(__file__).with_name("started").write_text(oci_registry.url)
    time.sleep(600)
'''


@pytest.mark.e2e
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_session_takes_its_registry_with_it(tmp_path: Path, how: int) -> None:
    require_binary(REGISTRY_BINARY)
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:timeout",
         str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists():
            assert session.poll() is None, "the inner session ended before its registry started"
            assert time.monotonic() < deadline, "the inner registry did not start"
            time.sleep(0.1)
        registries = [pid for pid in children(session.pid)
                      if "docker-registry" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
                          errors="replace")]
        assert registries, "no registry among the session's children"
        os.kill(session.pid, how)
        session.wait(timeout=60)
        deadline = time.monotonic() + 20
        while any(running(pid) for pid in registries) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in registries if running(pid)]
        for pid in left:  # leave the machine as it was, then fail
            os.kill(pid, signal.SIGKILL)
        assert left == []
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
