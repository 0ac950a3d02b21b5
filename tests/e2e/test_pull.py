"""`ocistage pull` and `inspect` end to end: real docker-registry (HTTP, HTTPS, htpasswd, token
auth), skopeo as the reference puller, and a fault-injecting proxy."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_ocistage.components import Registry, component_unavailable, require_binary, require_root
from pytest_ocistage.faultproxy import Fault, FaultProxy
from pytest_ocistage.images import ImageRef, host_architecture
from tests.e2e.conftest import (
    HTPASSWD_PASSWORD,
    HTPASSWD_USER,
    TOKEN_PASSWORD,
    TOKEN_USER,
    OcistageRunner,
)


def blob_set(layout: Path) -> dict[str, bytes]:
    return {f"sha256:{p.name}": p.read_bytes()
            for p in (layout / "blobs" / "sha256").iterdir()}


def cache_blobs(cache: Path) -> set[str]:
    return {f"sha256:{p.name}" for p in (cache / "blobs" / "sha256").iterdir()}


def assert_pulled(image: ImageRef, cache: Path, manifest_digest: str | None = None) -> None:
    blobs = cache_blobs(cache)
    assert set(image.layer_digests) <= blobs
    if image.config_digest:
        assert image.config_digest in blobs
    assert (manifest_digest or image.digest) in blobs
    for digest in blobs:  # every published blob is exactly its digest
        data = (cache / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()
        import hashlib
        assert hashlib.sha256(data).hexdigest() == digest.removeprefix("sha256:")
    assert not list((cache / "ingest").glob("*.partial"))


def wait_for_partial(child: subprocess.Popen[Any], partial: Path, size: int) -> None:
    """Wait until ``child`` (still running) has written ``size`` bytes of ``partial``."""
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size >= size):
        assert time.monotonic() < deadline, "the pull never got going"
        assert child.poll() is None, child.communicate()
        time.sleep(0.05)


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "hint:" in result.stderr
    return lines[0]


# -- the happy paths ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["busybox", "busybox-zstd", "busybox-v2s2", "multilayer"])
def test_pull_prints_the_manifest_digest_and_fills_the_cache(
        images: dict[str, ImageRef], ocistage: OcistageRunner, name: str) -> None:
    image = images[name]
    result = ocistage("pull", image.ref, check=True)
    assert result.stdout.strip() == image.digest
    assert_pulled(image, ocistage.cache)
    index = json.loads((ocistage.cache / "index.json").read_text())
    named = {m["annotations"]["org.opencontainers.image.ref.name"]: m["digest"]
             for m in index["manifests"]}
    # the platform's record and the plain name (cache/refnames.py): both name the manifest
    assert named == {f"{image.ref}+linux/{host_architecture()}": image.digest,
                     image.ref: image.digest}


def test_pulled_blobs_are_identical_to_skopeo_copy(
        images: dict[str, ImageRef], ocistage: OcistageRunner, tmp_path: Path) -> None:
    require_binary("skopeo")
    for name in ("busybox", "multilayer", "busybox-v2s2"):
        image = images[name]
        layout = tmp_path / f"skopeo-{name}"
        subprocess.run(["skopeo", "copy", "-q", "--src-tls-verify=false",
                        f"docker://{image.ref}", f"oci:{layout}:x"], check=True)
        ocistage("pull", image.ref, check=True)
        theirs = blob_set(layout)
        skopeo_manifest = json.loads((layout / "index.json").read_text())["manifests"][0]
        if image.media_type.startswith("application/vnd.docker"):
            # skopeo converts Docker v2s2 manifests to OCI for an oci: layout; we keep the
            # registry's bytes (and digest), so only config and layers can be compared
            assert skopeo_manifest["digest"] != image.digest
            del theirs[skopeo_manifest["digest"]]
            assert image.digest in cache_blobs(ocistage.cache)
        else:
            assert skopeo_manifest["digest"] == image.digest
        ours = {d: (ocistage.cache / "blobs/sha256" / d[7:]).read_bytes() for d in theirs}
        assert ours == theirs


def test_cache_is_an_oci_layout_that_skopeo_and_umoci_read(
        images: dict[str, ImageRef], ocistage: OcistageRunner, tmp_path: Path) -> None:
    require_binary("skopeo")
    require_binary("umoci")
    image = images["busybox"]
    ocistage("pull", image.ref, check=True)
    out = subprocess.run(["skopeo", "inspect", "--raw", f"oci:{ocistage.cache}:{image.ref}"],
                         check=True, capture_output=True)
    assert json.loads(out.stdout)["config"]["digest"] == image.config_digest
    subprocess.run(["umoci", "unpack", "--rootless", "--image",
                    f"{ocistage.cache}:{image.ref}", str(tmp_path / "bundle")], check=True,
                   capture_output=True)
    assert (tmp_path / "bundle/rootfs/bin/busybox").is_file()


def test_second_pull_fetches_nothing(images: dict[str, ImageRef], ocistage: OcistageRunner,
                                     fault_proxy: FaultProxy) -> None:
    image = images["multilayer"]
    ref = image.via(fault_proxy.host)
    ocistage("pull", ref, check=True)
    first = fault_proxy.counts()
    assert all(first.get(f"/v2/{image.repository}/blobs/{d}", 0) == 1
               for d in image.layer_digests)
    second = ocistage("pull", "--json", ref, check=True)
    report = json.loads(second.stdout)
    assert report["fetched_bytes"] == 0
    assert report["reused_blobs"] == len(image.layer_digests) + 1
    blob_gets = [r for r in fault_proxy.requests[len(fault_proxy.requests) - 10:]
                 if "/blobs/" in r.path]
    assert sum(fault_proxy.counts().get(f"/v2/{image.repository}/blobs/{d}", 0)
               for d in image.layer_digests) == len(image.layer_digests), blob_gets


def test_multiarch_platform_selection(images: dict[str, ImageRef],
                                      ocistage: OcistageRunner) -> None:
    image = images["multiarch"]
    for platform, digest in image.platforms.items():
        result = ocistage("pull", "--platform", platform, "--json", image.ref, check=True)
        report = json.loads(result.stdout)
        assert report["digest"] == digest
        assert report["index_digest"] == image.digest
        assert report["platform"].split("/")[:2] == platform.split("/")[:2]
    missing = ocistage("pull", "--platform", "linux/s390x", image.ref)
    assert missing.returncode == 1
    assert "s390x" in error_line(missing)
    assert "linux/amd64" in missing.stderr  # the message lists what is available


def test_pull_by_digest_and_tag_plus_digest(images: dict[str, ImageRef],
                                            ocistage: OcistageRunner) -> None:
    image = images["busybox"]
    by_digest = ocistage("pull", image.by_digest, check=True)
    assert by_digest.stdout.strip() == image.digest
    wrong = image.ref + "@sha256:" + "0" * 64
    result = ocistage("pull", wrong)
    assert result.returncode == 1
    error_line(result)


def test_inspect_json(images: dict[str, ImageRef], ocistage: OcistageRunner) -> None:
    image = images["multilayer"]
    result = ocistage("inspect", "--json", image.ref, check=True)
    report = json.loads(result.stdout)
    assert report["digest"] == image.digest
    assert [layer["digest"] for layer in report["layers"]] == list(image.layer_digests)
    assert report["config"]["digest"] == image.config_digest
    human = ocistage("inspect", image.ref, check=True)
    assert image.layer_digests[0] in human.stdout
    # inspect never downloads layers
    assert not set(image.layer_digests) & cache_blobs(ocistage.cache)


def test_local_sources(images: dict[str, ImageRef], ocistage: OcistageRunner,
                       tmp_path: Path) -> None:
    require_binary("skopeo")
    image = images["busybox"]
    oci = ocistage("pull", image.oci_ref, check=True)
    assert oci.stdout.strip() == image.digest
    archive = tmp_path / "busybox.docker.tar"
    subprocess.run(["skopeo", "copy", "-q", image.oci_ref,
                    f"docker-archive:{archive}:ocistage-test/busybox:1"], check=True)
    docker = ocistage("pull", "--json", f"docker-archive:{archive}", check=True)
    report = json.loads(docker.stdout)
    assert report["config"] == image.config_digest
    oci_archive = tmp_path / "busybox.oci.tar"
    subprocess.run(["skopeo", "copy", "-q", image.oci_ref, f"oci-archive:{oci_archive}:b"],
                   check=True)
    from_archive = ocistage("pull", f"oci-archive:{oci_archive}:b", check=True)
    assert from_archive.stdout.strip() == image.digest


# -- TLS and authentication ------------------------------------------------------------------


def test_https_registry_needs_its_ca(images: dict[str, ImageRef], ocistage: OcistageRunner,
                                     tls_registry: Registry) -> None:
    image = images["tls/busybox"]
    # loopback registries skip TLS verification by default (as Docker does); turn that off
    config = ocistage.home / ".config/ocistage/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("loopback_insecure = false\n")
    refused = ocistage("pull", image.ref)
    assert refused.returncode == 1
    assert "certificate" in error_line(refused).lower()
    # no retry can change a certificate; the hint says what can
    assert "retrying" not in refused.stderr
    assert "--ca-file" in refused.stderr and "--insecure-registry" in refused.stderr
    ok = ocistage("pull", "--ca-file", str(tls_registry.ca_file), image.ref, check=True)
    assert ok.stdout.strip() == image.digest
    insecure = ocistage("pull", "--insecure-registry", tls_registry.host, image.ref,
                        env={"OCISTAGE_CACHE": str(ocistage.cache) + "-2"}, check=True)
    assert insecure.stdout.strip() == image.digest


def test_a_bad_ca_file_is_a_usage_error_naming_its_source(
        images: dict[str, ImageRef], ocistage: OcistageRunner, tls_registry: Registry,
        tmp_path: Path) -> None:
    """A missing, unreadable or empty CA file, from the option, the environment or the
    config file, is refused before any connection (exit 2, no retries), naming where it was
    given; a CA that does not sign the registry is named in the hint."""
    image = images["tls/busybox"]
    config = ocistage.home / ".config/ocistage/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'loopback_insecure = false\nca_file = "{tmp_path / "gone.pem"}"\n')
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    for argv, env, origin in (
            (["--ca-file", str(tmp_path / "none.pem")], {}, "option --ca-file"),
            ([], {"OCISTAGE_CA_FILE": str(garbage)}, "environment OCISTAGE_CA_FILE"),
            ([], {}, f"file {config}")):
        started = time.monotonic()
        result = ocistage("pull", *argv, image.ref, env=env)
        assert result.returncode == 2, result.stderr
        assert f"({origin})" in error_line(result)
        assert "--ca-file" in result.stderr and "retrying" not in result.stderr
        assert time.monotonic() - started < 10
    # a certificate of the right form that signs something else
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(other / "key.pem"), "-out", str(other / "ca.pem"),
                    "-subj", "/CN=other"], check=True, capture_output=True)
    wrong = ocistage("pull", "--ca-file", str(other / "ca.pem"), image.ref)
    assert wrong.returncode == 1
    assert "certificate" in error_line(wrong).lower()
    assert f"the CA file {other / 'ca.pem'} does not vouch for it" in wrong.stderr
    ok = ocistage("pull", "--ca-file", str(tls_registry.ca_file), image.ref, check=True)
    assert ok.stdout.strip() == image.digest


def _auth_file(path: Path, host: str, user: str, password: str) -> Path:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    return path


def test_htpasswd_registry_basic_auth(images: dict[str, ImageRef], ocistage: OcistageRunner,
                                      htpasswd_registry: Registry) -> None:
    image = images["htpasswd/busybox"]
    anonymous = ocistage("pull", image.ref)
    assert anonymous.returncode == 1
    assert htpasswd_registry.host in error_line(anonymous)
    _auth_file(ocistage.home / ".docker/config.json", htpasswd_registry.host, "x", "wrong")
    wrong = ocistage("pull", image.ref)
    assert wrong.returncode == 1
    error_line(wrong)
    auth = _auth_file(ocistage.home / "auth.json", htpasswd_registry.host,
                      HTPASSWD_USER, HTPASSWD_PASSWORD)
    ok = ocistage("pull", image.ref, env={"REGISTRY_AUTH_FILE": str(auth)}, check=True)
    assert ok.stdout.strip() == image.digest


def test_token_registry_anonymous_and_authenticated(
        images: dict[str, ImageRef], ocistage: OcistageRunner,
        token_registry: Registry) -> None:
    public, private = images["token/public"], images["token/private"]
    assert ocistage("pull", public.ref, check=True).stdout.strip() == public.digest
    refused = ocistage("pull", private.ref)
    assert refused.returncode == 1
    error_line(refused)
    _auth_file(ocistage.home / "run/containers/auth.json", token_registry.host,
               TOKEN_USER, TOKEN_PASSWORD)
    ok = ocistage("pull", private.ref, check=True)
    assert ok.stdout.strip() == private.digest


# -- faults ----------------------------------------------------------------------------------


def test_dropped_connection_resumes_with_range(images: dict[str, ImageRef],
                                               ocistage: OcistageRunner,
                                               fault_proxy: FaultProxy) -> None:
    image = images["busybox"]
    layer = image.layer_digests[0]
    fault_proxy.add(Fault(rf"/blobs/{layer}", "drop", after_bytes=100_000))
    result = ocistage("pull", image.via(fault_proxy.host), check=True)
    assert result.stdout.strip() == image.digest
    layer_requests = [r for r in fault_proxy.requests if r.path.endswith(layer)]
    assert len(layer_requests) == 2
    assert layer_requests[1].headers.get("Range", "").startswith("bytes=")
    assert_pulled(image, ocistage.cache)


def test_corrupt_blob_is_refetched_then_refused(images: dict[str, ImageRef],
                                                ocistage: OcistageRunner,
                                                fault_proxy: FaultProxy) -> None:
    image = images["busybox"]
    layer = image.layer_digests[0]
    fault_proxy.add(Fault(rf"/blobs/{layer}", "flip", after_bytes=1000, times=1))
    ok = ocistage("pull", image.via(fault_proxy.host), check=True)
    assert ok.stdout.strip() == image.digest
    fault_proxy.add(Fault(rf"/blobs/{layer}", "flip", after_bytes=1000, times=100))
    cache = ocistage.cache.parent / "cache-corrupt"
    bad = ocistage("pull", image.via(fault_proxy.host), env={"OCISTAGE_CACHE": str(cache)})
    assert bad.returncode == 1
    assert "digest" in error_line(bad)
    assert not (cache / "blobs/sha256" / layer[7:]).exists()


def test_truncated_body_is_never_published(images: dict[str, ImageRef],
                                           ocistage: OcistageRunner,
                                           fault_proxy: FaultProxy) -> None:
    image = images["busybox"]
    layer = image.layer_digests[0]
    fault_proxy.add(Fault(rf"/blobs/{layer}", "truncate", after_bytes=5000, times=100))
    bad = ocistage("pull", image.via(fault_proxy.host))
    assert bad.returncode == 1
    error_line(bad)
    assert not (ocistage.cache / "blobs/sha256" / layer[7:]).exists()
    fault_proxy.clear()
    ok = ocistage("pull", image.via(fault_proxy.host), check=True)
    assert ok.stdout.strip() == image.digest


def test_rate_limit_and_server_errors_are_retried(images: dict[str, ImageRef],
                                                  ocistage: OcistageRunner,
                                                  fault_proxy: FaultProxy) -> None:
    image = images["busybox"]
    fault_proxy.add(Fault(r"/manifests/", "status", status=429, retry_after="1", times=2))
    fault_proxy.add(Fault(r"/blobs/", "status", status=503, times=2))
    started = time.monotonic()
    ok = ocistage("pull", image.via(fault_proxy.host), check=True)
    assert ok.stdout.strip() == image.digest
    assert time.monotonic() - started >= 2.0  # Retry-After: 1 was honoured twice
    statuses = [r.status for r in fault_proxy.requests if "/manifests/" in r.path]
    assert statuses[:3] == [429, 429, 200]


def test_persistent_rate_limit_gives_up_with_a_hint(images: dict[str, ImageRef],
                                                    ocistage: OcistageRunner,
                                                    fault_proxy: FaultProxy) -> None:
    image = images["busybox"]
    fault_proxy.add(Fault(r"/manifests/", "status", status=429, retry_after="0", times=1000))
    result = ocistage("pull", image.via(fault_proxy.host), timeout=120)
    assert result.returncode == 1
    assert "429" in error_line(result) or "rate" in error_line(result).lower()


def test_user_mistakes_and_remote_faults(images: dict[str, ImageRef], ocistage: OcistageRunner,
                                         plain_registry: Registry) -> None:
    unknown_tag = ocistage("pull", f"{plain_registry.host}/busybox:no-such-tag")
    assert unknown_tag.returncode == 1
    assert "no-such-tag" in error_line(unknown_tag)
    unknown_repo = ocistage("pull", f"{plain_registry.host}/no/such/repo:1")
    assert unknown_repo.returncode == 1
    error_line(unknown_repo)
    down = ocistage("pull", "127.0.0.1:9/busybox:1")
    assert down.returncode == 1
    assert "127.0.0.1:9" in error_line(down)
    invalid = ocistage("pull", "Not A Reference")
    assert invalid.returncode == 2
    error_line(invalid)
    schema_bad_platform = ocistage("pull", "--platform", "bogus", images["busybox"].ref)
    assert schema_bad_platform.returncode == 2


def test_kill_9_during_pull_then_rerun_completes(images: dict[str, ImageRef],
                                                 ocistage: OcistageRunner,
                                                 fault_proxy: FaultProxy) -> None:
    image = images["busybox"]
    layer = image.layer_digests[0]
    # the proxy sends part of the layer and then stalls, so the pull is caught mid-blob
    fault_proxy.add(Fault(rf"/blobs/{layer}", "stall", after_bytes=200_000))
    child = subprocess.Popen([*ocistage.command, "pull", image.via(fault_proxy.host)],
                             env=ocistage.environment(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    partial = ocistage.cache / "ingest" / f"{layer[7:]}.partial"
    wait_for_partial(child, partial, 100_000)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    kept = partial.stat().st_size  # what reached the disk before the kill (<= 200 000)
    assert 100_000 <= kept <= 200_000
    fault_proxy.clear()
    rerun = ocistage("pull", image.via(fault_proxy.host), check=True)
    assert rerun.stdout.strip() == image.digest
    resumed = [r for r in fault_proxy.requests if r.path.endswith(layer)][-1]
    assert resumed.headers.get("Range") == f"bytes={kept}-"
    assert_pulled(image, ocistage.cache)


def test_disk_full_leaves_no_partial_blob(images: dict[str, ImageRef], ocistage: OcistageRunner,
                                          tmp_path: Path) -> None:
    require_root()  # mounting a small tmpfs needs root
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(small)],
                             capture_output=True)
    if mounted.returncode != 0:
        component_unavailable(f"cannot mount a tmpfs: {mounted.stderr.decode()}")
    try:
        image = images["busybox"]
        result = ocistage("pull", image.ref, env={"OCISTAGE_CACHE": str(small / "cache")})
        assert result.returncode == 1
        assert "no space left" in error_line(result)
        layer = image.layer_digests[0]
        assert not (small / "cache/blobs/sha256" / layer[7:]).exists()
    finally:
        subprocess.run(["umount", str(small)], check=False)
