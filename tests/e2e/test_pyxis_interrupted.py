"""An interrupted importer ``get`` leaves no lease (issue 34, item 7): SIGTERM and SIGINT end it
cleanly (its leases released, its scratch removed, exit 130) while it pulls from a stalled
registry or while mksquashfs builds; after a SIGKILL the next importer command of the same
user (``get`` or ``release``) drops what the killed get left, and never another user's lease."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_ocistage.components import Registry
from pytest_ocistage.faultproxy import Fault, FaultProxy
from pytest_ocistage.imagebuild import File
from pytest_ocistage.images import ImageRef
from pytest_ocistage.plugin import ImageFactory
from tests.deadline import wait_until
from tests.e2e.conftest import OcistageRunner
from tests.procs import default_sigint, descendants_named

pytestmark = pytest.mark.e2e

PAYLOAD = 24 << 20   # incompressible: mksquashfs runs long enough to be found and frozen


@pytest.fixture
def image(oci_image: ImageFactory, oci_registry: Registry) -> ImageRef:
    built = oci_image({"data/blob": File(os.urandom(PAYLOAD)), "etc/hostname": "x\n"},
                      cmd=["/data/blob"])
    return built.push(oci_registry, "pyxis/interrupted", "1")


def uri(image: ImageRef, host: str | None = None) -> str:
    return f"docker://{host or image.registry.host}#{image.repository}:1"


def start_get(ocistage: OcistageRunner, target: str,
              survivors: list[int]) -> subprocess.Popen[str]:
    get = subprocess.Popen([sys.executable, "-m", "ocistage.bundler.pyxis.main", "get", target],
                           env=ocistage.environment(), cwd=ocistage.cwd, text=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, preexec_fn=default_sigint)
    survivors.append(get.pid)
    return get


def importer(ocistage: OcistageRunner, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ocistage.bundler.pyxis.main", *args],
                          env=ocistage.environment(), cwd=ocistage.cwd, timeout=300,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)


def leases(store: Path) -> list[str]:
    directory = store / "leases"
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def scratch(store: Path) -> list[str]:
    tmp = store / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []


def building(get: subprocess.Popen[str], survivors: list[int]) -> None:
    """Wait until ``get``'s mksquashfs builds, and stop it there (SIGSTOP) so that it cannot
    finish before the test has signalled the importer."""
    def mksquashfs() -> int | None:
        for pid in descendants_named(get.pid, "mksquashfs"):
            with contextlib.suppress(OSError):
                if b"\0-noappend\0" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
        return None

    found = wait_until(lambda: mksquashfs() or get.poll() is not None, "no mksquashfs started")
    assert get.poll() is None, get.communicate()
    assert isinstance(found, int)
    survivors.append(found)
    os.kill(found, signal.SIGSTOP)


def pulling(get: subprocess.Popen[str], proxy: FaultProxy, layer: str) -> None:
    """Wait until ``get`` is stalled in the layer's download (the proxy holds it)."""
    wait_until(lambda: any(r.path.endswith(layer) for r in proxy.requests)
               or get.poll() is not None, "the layer was never asked for")
    assert get.poll() is None, get.communicate()


def interrupted_get(phase: str, ocistage: OcistageRunner, image: ImageRef,
                    proxy: FaultProxy, survivors: list[int]) -> subprocess.Popen[str]:
    """A get stopped while it pulls (the registry stalls mid-layer) or builds."""
    layer = image.layer_digests[-1].split(":")[1]
    if phase == "pull":
        proxy.add(Fault(rf"/blobs/sha256:{layer}", "stall", after_bytes=200_000,
                        stall_seconds=300))
    get = start_get(ocistage, uri(image, proxy.host), survivors)
    if phase == "pull":
        pulling(get, proxy, layer)
    else:
        building(get, survivors)
    # the get holds leases in both places now
    assert leases(ocistage.cache), "the get took no lease"
    return get


@pytest.mark.parametrize("phase", ["pull", "build"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_terminated_get_leaves_no_lease_and_no_scratch(
        signum: int, phase: str, ocistage: OcistageRunner, image: ImageRef,
        fault_proxy: FaultProxy, survivors: list[int]) -> None:
    """Before: the step's lease (a pin outside a job) stayed in STORE/leases after the get
    ended with 'interrupted'."""
    get = interrupted_get(phase, ocistage, image, fault_proxy, survivors)
    get.send_signal(signum)
    out, err = get.communicate(timeout=120)
    fault_proxy.clear()
    assert get.returncode == 130, err
    assert out == "" and err.startswith("error: interrupted"), err
    assert leases(ocistage.cache) == []
    assert scratch(ocistage.cache) == []


@pytest.mark.needs_root("another user's lease is made by chown")
@pytest.mark.parametrize("phase", ["pull", "build"])
@pytest.mark.parametrize("command", ["release", "get"])
def test_the_next_command_drops_what_a_killed_get_left(
        command: str, phase: str, ocistage: OcistageRunner, image: ImageRef,
        fault_proxy: FaultProxy, survivors: list[int]) -> None:
    """SIGKILL cannot be handled: the killed get's leases stay (held by a dead process) until
    the next importer command of the user, which drops them; a dead process's lease of
    another user stays (that user's next command drops it, or ``cache gc``). Before: both
    stayed, the step's lease a pin that nothing but a ``release`` outside a job drops."""
    get = interrupted_get(phase, ocistage, image, fault_proxy, survivors)
    get.kill()
    get.communicate(timeout=120)
    fault_proxy.clear()
    left = leases(ocistage.cache)
    assert left, "a SIGKILLed get left no lease: nothing to test"
    directory = ocistage.cache / "leases"
    others = directory / "someone-else.json"
    dead = [name for name in left if not name.startswith("pyxis-")]
    assert dead, left  # the pull's lease, held by the killed process
    others.write_bytes((directory / dead[0]).read_bytes())
    os.chown(others, 65534, 65534)
    if command == "get":
        again = importer(ocistage, "get", uri(image))
        assert again.returncode == 0, again.stderr
        key = Path(again.stdout.strip()).name.removesuffix(".sqsh")
        assert leases(ocistage.cache) == [f"pyxis-nojob.none-{key[:32]}.json",
                                          "someone-else.json"]
        assert importer(ocistage, "release").returncode == 0
    else:
        assert importer(ocistage, "release").returncode == 0
    assert leases(ocistage.cache) == ["someone-else.json"]
    assert scratch(ocistage.cache) == []
