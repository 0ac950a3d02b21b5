"""Slow and stalled servers, retries a user can see, and Ctrl-C during a download: the real
client against the real registry behind the fault proxy, and a real SIGINT to a real CLI."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ocistage.bundler.registry.client import RegistryClient
from ocistage.bundler.registry.credentials import CredentialStore
from ocistage.bundler.registry.errors import RegistryUnreachable
from ocistage.bundler.registry.types import RegistryConfig
from ocistage.cache.digest import Digest
from ocistage.cache.store import Store
from pytest_ocistage.faultproxy import Fault, FaultProxy
from pytest_ocistage.images import ImageRef
from tests.e2e.conftest import OcistageRunner
from tests.e2e.test_pull import wait_for_partial
from tests.procs import default_sigint

ACCEPT = ["application/vnd.oci.image.manifest.v1+json",
          "application/vnd.oci.image.index.v1+json",
          "application/vnd.docker.distribution.manifest.v2+json"]


def _client(proxy: FaultProxy, **config: float) -> RegistryClient:
    settings = RegistryConfig(credentials=CredentialStore([]), backoff_base=0.05,
                              **config)  # type: ignore[arg-type]
    return RegistryClient(proxy.host, settings)


def test_a_trickled_manifest_is_cut_off_and_retried(
        images: dict[str, ImageRef], fault_proxy: FaultProxy,
        caplog: pytest.LogCaptureFixture) -> None:
    image = images["busybox"]
    # a byte every 0.5 s never times a read out; before the watchdog this hung for the
    # whole of stall_seconds
    fault_proxy.add(Fault(r"/manifests/", "trickle", after_bytes=10, interval=0.5,
                          stall_seconds=600))
    caplog.set_level(logging.INFO, logger="ocistage.retry")
    with _client(fault_proxy, min_speed=100, speed_window=2) as client:
        fetched = client.get_manifest(image.repository, image.tag, ACCEPT)
    assert str(fetched.digest) == image.digest
    assert fault_proxy.count(r"/manifests/") == 2
    notes = [r.getMessage() for r in caplog.records if r.name == "ocistage.retry"]
    assert len(notes) == 1 and "slower than 100 B/s for 2 s" in notes[0], notes


def test_headers_that_never_complete_hit_the_deadline(
        images: dict[str, ImageRef], fault_proxy: FaultProxy) -> None:
    image = images["busybox"]
    fault_proxy.add(Fault(r"/manifests/", "trickle_headers", interval=0.2, times=10,
                          stall_seconds=600))
    with _client(fault_proxy, deadline=2, max_retries=1) as client, \
            pytest.raises(RegistryUnreachable) as raised:
        client.get_manifest(image.repository, image.tag, ACCEPT)
    assert "sent no complete answer: the request took longer than 2 s" in str(raised.value)
    assert fault_proxy.count(r"/manifests/") == 2  # tried, retried once, gave up


def test_a_stalled_blob_is_resumed_where_it_stopped(
        images: dict[str, ImageRef], fault_proxy: FaultProxy, tmp_path: Path) -> None:
    image = images["busybox"]
    layer = Digest.parse(image.layer_digests[0])
    fault_proxy.add(Fault(rf"/blobs/{layer}", "trickle", after_bytes=100_000, interval=1.0,
                          stall_seconds=600))
    store = Store.open(tmp_path / "cache")
    with _client(fault_proxy, min_speed=1000, speed_window=1) as client, \
            store.ingest(layer) as ingest:
        assert ingest is not None
        client.fetch_blob(image.repository, layer, None, ingest)
        ingest.commit()
    assert store.has_blob(layer)
    ranges = [r.headers.get("Range") for r in fault_proxy.requests
              if r.path.endswith(str(layer))]
    assert len(ranges) == 2 and ranges[0] is None
    assert ranges[1] is not None and int(ranges[1][6:-1]) >= 100_000


def test_a_retry_is_a_line_on_stderr_unless_quiet(
        images: dict[str, ImageRef], ocistage: OcistageRunner,
        fault_proxy: FaultProxy) -> None:
    image = images["busybox"]
    fault_proxy.add(Fault(r"/manifests/", "status", status=503, retry_after="0", times=2))
    shown = ocistage("pull", image.via(fault_proxy.host), check=True)
    notes = [line for line in shown.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 2, shown.stderr
    assert "answered HTTP 503; retrying in 0.0 s (attempt 2 of 6)" in notes[0]
    fault_proxy.clear()
    fault_proxy.add(Fault(r"/manifests/", "status", status=503, retry_after="0", times=2))
    quiet = ocistage("pull", "-q", image.via(fault_proxy.host), check=True)
    assert "note:" not in quiet.stderr and "retrying" not in quiet.stderr


def _interrupted_run(ocistage: OcistageRunner, argv: list[str],
                     ready: Callable[[subprocess.Popen[str]], None],
                     timeout: float = 30) -> tuple[int, str]:
    """Run ``ocistage ARGV``, wait until ``ready(child)`` returns, press Ctrl-C; the exit
    status and stderr (the child is killed if it has not ended within ``timeout``).

    SIGINT as a terminal gives it (:func:`tests.procs.default_sigint`).
    """
    child = subprocess.Popen([*ocistage.command, *argv], env=ocistage.environment(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=default_sigint)
    try:
        ready(child)
        os.kill(child.pid, signal.SIGINT)
        _, stderr = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return child.returncode, stderr


@pytest.mark.parametrize("command", ["pull", "bundle"])
def test_ctrl_c_stops_a_download_at_once_and_keeps_it_for_resume(
        images: dict[str, ImageRef], ocistage: OcistageRunner, fault_proxy: FaultProxy,
        tmp_path: Path, command: str) -> None:
    image = images["busybox"]
    layer = image.layer_digests[0]
    # the layer stalls for 10 minutes: without a prompt stop the child outlives the wait below
    fault_proxy.add(Fault(rf"/blobs/{layer}", "stall", after_bytes=200_000, stall_seconds=600))
    argv = [command, image.via(fault_proxy.host)]
    if command == "bundle":
        argv.append(str(tmp_path / "bundle"))
    partial = ocistage.cache / "ingest" / f"{layer[7:]}.partial"
    code, stderr = _interrupted_run(ocistage, argv,
                                    lambda child: wait_for_partial(child, partial, 100_000))
    assert code == 130, stderr
    assert "Traceback" not in stderr
    assert f"error: interrupted; the partial downloads are kept in {ocistage.cache}/ingest" \
        in stderr
    assert partial.stat().st_size >= 100_000
    assert not (tmp_path / "bundle").exists()
    fault_proxy.clear()
    rerun = ocistage("pull", image.via(fault_proxy.host), check=True)
    assert rerun.stdout.strip() == image.digest
    resumed = [r for r in fault_proxy.requests if r.path.endswith(layer)]
    assert resumed[-1].headers.get("Range", "").startswith("bytes=")


@pytest.fixture
def blackhole() -> Iterator[str]:
    """``127.0.0.1:PORT`` where a TCP connect hangs (SYNs dropped): a listening socket that
    never accepts, with its accept queue (backlog 0: one connection) already full."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        filler.close()
        server.close()


def _syn_sent_to(port: int) -> bool:
    """Whether a TCP connect to 127.0.0.1:``port`` is waiting for its SYN's answer (state
    SYN_SENT in /proc/net/tcp: the connect() a blackhole keeps hanging)."""
    wanted = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as table:
        next(table)
        return any(fields[2] == wanted and fields[3] == "02"
                   for fields in (line.split() for line in table))


@pytest.mark.parametrize("command", ["pull", "bundle"])
def test_ctrl_c_while_a_download_is_still_connecting_ends_the_run(
        images: dict[str, ImageRef], ocistage: OcistageRunner, fault_proxy: FaultProxy,
        blackhole: str, tmp_path: Path, command: str) -> None:
    image = images["busybox"]
    layer = image.layer_digests[0]
    # the registry sends the layer to a storage host whose connect never completes: the
    # download thread waits in connect() (30 s connect timeout), where no socket shutdown
    # reaches it
    fault_proxy.add(Fault(rf"/blobs/{layer}", "redirect", location=f"http://{blackhole}/x",
                          times=100))
    argv = [command, image.via(fault_proxy.host)]
    if command == "bundle":
        argv.append(str(tmp_path / "bundle"))
    port = int(blackhole.rsplit(":", 1)[1])

    def connecting(child: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 60
        while not _syn_sent_to(port):  # redirected, and now waiting in connect()
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)

    # well inside the 30 s connect timeout: before, the run waited for it
    code, stderr = _interrupted_run(ocistage, argv, connecting, timeout=10)
    assert code == 130, stderr
    assert "Traceback" not in stderr and "error: interrupted" in stderr
    assert not (tmp_path / "bundle").exists()
    fault_proxy.clear()  # and what it left behind does not stand in the way of the next run
    rerun = ocistage("pull", image.via(fault_proxy.host), check=True)
    assert rerun.stdout.strip() == image.digest


@pytest.mark.timeout(120)  # without the watchdog on proxied connections: a 600 s trickle
def test_a_trickle_through_an_environment_proxy_is_cut_off_too(
        images: dict[str, ImageRef], fault_proxy: FaultProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    image = images["busybox"]
    # the fault proxy as the forward proxy HTTP_PROXY names: it relays every absolute-form
    # request to the registry, so the client needs no DNS for the name below, which is no
    # loopback name (ocistage never proxies loopback registries) and resolves nowhere
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", fault_proxy.url)
    monkeypatch.setenv("HTTPS_PROXY", fault_proxy.url)
    fault_proxy.add(Fault(r"/manifests/", "trickle", after_bytes=10, interval=0.5,
                          stall_seconds=600))
    registry = "registry.ocistage.invalid"
    settings = RegistryConfig(credentials=CredentialStore([]), backoff_base=0.05,
                              min_speed=100, speed_window=2,
                              insecure_registries=frozenset({registry}))
    with RegistryClient(registry, settings) as client:
        fetched = client.get_manifest(image.repository, image.tag, ACCEPT)
    assert str(fetched.digest) == image.digest
    manifests = [r for r in fault_proxy.requests if "/manifests/" in r.path]
    assert len(manifests) == 2  # through the proxy, cut off by the watchdog, retried
    assert manifests[0].path.startswith("http://")  # a forward proxy's absolute-form request
