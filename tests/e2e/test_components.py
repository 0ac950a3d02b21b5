"""The end-to-end fixtures themselves work: images, registries, token auth, fault proxy."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pytest_ocistage import components
from pytest_ocistage.components import Registry, require_binary
from pytest_ocistage.faultproxy import Fault, FaultProxy, running_fault_proxy
from pytest_ocistage.fixturelayers import (
    ESCAPING_LINK_TARGET,
    LONG_NAME,
    XATTR_NAME,
    XATTR_VALUE,
)
from pytest_ocistage.images import (
    MEDIA_INDEX,
    MEDIA_MANIFEST,
    OS_RELEASE_NAME,
    FixtureLayouts,
    ImageRef,
    cache_key,
    fixture_layouts,
)
from pytest_ocistage.tokenissuer import TokenIssuer
from tests.e2e.conftest import (
    HTPASSWD_PASSWORD,
    HTPASSWD_USER,
    TOKEN_PASSWORD,
    TOKEN_USER,
    OcistageRunner,
)

MEDIA_V2S2 = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
MEDIA_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"


def skopeo(*args: str) -> subprocess.CompletedProcess[str]:
    require_binary("skopeo")
    return subprocess.run(["skopeo", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def inspect(image: ImageRef, *extra: str, creds: bool = True) -> subprocess.CompletedProcess[str]:
    return skopeo("inspect", *image.registry.skopeo_flags(with_creds=creds), *extra,
                  f"docker://{image.ref}")


def get(url: str, headers: dict[str, str] | None = None,
        registry: Registry | None = None) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request without urllib's error handling in the way."""
    parts = urlsplit(url)
    context = registry.ssl_context() if registry is not None else None
    conn = (http.client.HTTPSConnection(parts.netloc, timeout=30, context=context)
            if parts.scheme == "https" else http.client.HTTPConnection(parts.netloc, timeout=30))
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def blob_url(base: str, image: ImageRef, digest: str) -> str:
    return f"{base}/v2/{image.repository}/blobs/{digest}"


def blob_bytes(image: ImageRef, digest: str) -> bytes:
    status, _, body = get(blob_url(image.registry.url, image, digest), registry=image.registry)
    assert status == 200
    assert "sha256:" + hashlib.sha256(body).hexdigest() == digest
    return body


# --- missing components -----------------------------------------------------------------------

def test_missing_binary_skips_unless_e2e_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OCISTAGE_REQUIRE_E2E", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-such-ocistage-tool not found"):
        require_binary("no-such-ocistage-tool")
    monkeypatch.setenv("OCISTAGE_REQUIRE_E2E", "1")
    with pytest.raises(pytest.fail.Exception, match="no-such-ocistage-tool not found"):
        require_binary("no-such-ocistage-tool")
    assert require_binary("sh").endswith("/sh")


def test_registry_never_mistakes_another_listener_for_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A port taken between probing and binding (say by another session's registry that
    answers /v2/ too) makes the new registry retry on another port, not adopt the impostor."""
    require_binary("docker-registry")

    class V2(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    impostor = ThreadingHTTPServer(("127.0.0.1", 0), V2)
    taken = impostor.server_address[1]
    thread = threading.Thread(target=impostor.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    ports = iter([taken, components.free_port()])
    monkeypatch.setattr(components, "free_port", lambda: next(ports))
    try:
        assert components.owns_listener(os.getpid(), taken)
        with components.running_registry(tmp_path / "registry") as registry:
            assert registry.host != f"127.0.0.1:{taken}"
            assert get(f"{registry.url}/v2/")[0] == 200
            assert not components.owns_listener(os.getpid(), int(registry.host.split(":")[1]))
    finally:
        impostor.shutdown()
        impostor.server_close()
        thread.join()


# --- fixture images -----------------------------------------------------------------------------

def test_layouts_are_built_once_and_reused(tmp_path: Path) -> None:
    require_binary("umoci")
    first = fixture_layouts(tmp_path)
    marker = first.layout.parent / "fixtures.json"
    stamp = marker.stat().st_mtime_ns
    second = fixture_layouts(tmp_path)
    assert second == first
    assert marker.stat().st_mtime_ns == stamp
    assert first.layout.parent.name == cache_key()
    assert [p.name for p in tmp_path.iterdir()] == [cache_key()]  # no build leftovers


def test_busybox_unpacks_with_umoci(fixture_layouts_built: FixtureLayouts,
                                    tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--rootless", "--image",
                    fixture_layouts_built.oci_ref("busybox").removeprefix("oci:"), str(bundle)],
                   check=True, capture_output=True)
    rootfs = bundle / "rootfs"
    assert os.readlink(rootfs / "bin" / "sh") == "busybox"
    assert OS_RELEASE_NAME in (rootfs / "etc" / "os-release").read_text()
    assert "app:x:1000:1000:" in (rootfs / "etc" / "passwd").read_text()
    assert (rootfs / "home" / "app" / ".profile").is_file()
    process = json.loads((bundle / "config.json").read_text())["process"]
    assert process["args"] == ["/bin/sh", "-c", "echo hello from busybox"]
    assert process["cwd"] == "/home/app"
    assert process["user"]["uid"] == 1000
    assert "GREETING=hello world" in process["env"]


def test_multilayer_encodes_every_layer_feature(fixture_layouts_built: FixtureLayouts,
                                                tmp_path: Path) -> None:
    """umoci, the reference unpacker, sees what the fixture claims to contain."""
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--rootless", "--image",
                    fixture_layouts_built.oci_ref("multilayer").removeprefix("oci:"),
                    str(bundle)], check=True, capture_output=True)
    data = bundle / "rootfs" / "data"
    assert not (data / "whiteme").exists()
    assert not (data / "whitedir").exists()
    assert sorted(p.name for p in (data / "opaque").iterdir()) == ["c"]
    assert (data / "willbefile").is_file()
    assert os.readlink(data / "willbelink") == "shared"
    assert (data / "hl-lower").stat().st_ino == (data / "shared").stat().st_ino
    assert (data / "hl-a").stat().st_ino == (data / "hl-b").stat().st_ino
    assert len(LONG_NAME) > 100
    assert (bundle / "rootfs" / LONG_NAME).is_file()
    assert os.getxattr(data / "xattr", XATTR_NAME) == XATTR_VALUE.encode()
    assert (data / "fifo").is_fifo()
    assert (data / "setuid").stat().st_mode & 0o7777 == 0o4755
    assert (data / "setgid").stat().st_mode & 0o7777 == 0o2755
    assert (data / "mode000").stat().st_mode & 0o7777 == 0
    assert (data / "ro").stat().st_mode & 0o777 == 0o555
    assert (data / "ro" / "added").is_file()
    assert os.readlink(data / "escape") == ESCAPING_LINK_TARGET
    assert not any(name.startswith(".wh.") for _, _, files in os.walk(data) for name in files)


def test_multiarch_index_shares_layers(fixture_layouts_built: FixtureLayouts) -> None:
    index = fixture_layouts_built.images["multiarch"]
    assert index.media_type == MEDIA_INDEX
    assert set(index.platforms) == {"linux/amd64", "linux/arm64/v8"}
    layout = fixture_layouts_built.layout
    configs = []
    for digest in index.platforms.values():
        manifest = json.loads((layout / "blobs" / "sha256" / digest[7:]).read_text())
        assert [layer["digest"] for layer in manifest["layers"]] == list(
            fixture_layouts_built.images["busybox"].layer_digests)
        configs.append(json.loads(
            (layout / "blobs" / "sha256" / manifest["config"]["digest"][7:]).read_text()))
    assert sorted(c["architecture"] for c in configs) == ["amd64", "arm64"]


@pytest.mark.parametrize("tag", ["busybox", "multilayer"])
def test_archives_hold_the_layout_images(fixture_layouts_built: FixtureLayouts,
                                         tag: str) -> None:
    source = fixture_layouts_built.images[tag]
    oci = json.loads(skopeo("inspect", fixture_layouts_built.oci_archive_ref(tag)).stdout)
    assert oci["Digest"] == source.digest
    docker = json.loads(skopeo("inspect", "--config", "--raw",
                               fixture_layouts_built.docker_archive_ref(tag)).stdout)
    assert tuple(docker["rootfs"]["diff_ids"]) == source.diff_ids


# --- registries ---------------------------------------------------------------------------------

PUSHED = ["busybox", "busybox-zstd", "busybox-v2s2", "multilayer", "multilayer-zstd",
          "multiarch", "multiarch-v2s2", "tls/busybox", "htpasswd/busybox", "token/public",
          "token/private"]


@pytest.mark.parametrize("name", PUSHED)
def test_skopeo_inspects_every_pushed_image(images: dict[str, ImageRef], name: str) -> None:
    image = images[name]
    raw = inspect(image, "--raw")
    assert raw.returncode == 0, raw.stderr
    assert "sha256:" + hashlib.sha256(raw.stdout.encode()).hexdigest() == image.digest
    by_digest = skopeo("inspect", "--raw", *image.registry.skopeo_flags(),
                       f"docker://{image.by_digest}")
    assert by_digest.returncode == 0 and by_digest.stdout == raw.stdout
    if image.config_digest is None:  # an index or manifest list
        assert len(image.platforms) == 2
        return
    info = json.loads(inspect(image).stdout)
    assert info["Digest"] == image.digest
    assert tuple(info["Layers"]) == image.layer_digests
    assert len(image.diff_ids) == len(image.layer_digests)
    if image.registry.username is None:  # anonymous: the blob itself matches its digest
        blob_bytes(image, image.layer_digests[-1])


def test_pushed_forms_are_what_their_names_say(images: dict[str, ImageRef],
                                               fixture_layouts_built: FixtureLayouts) -> None:
    source = fixture_layouts_built.images["busybox"]
    assert images["busybox"].digest == source.digest  # gzip OCI is pushed byte for byte
    assert images["busybox"].layer_digests == source.layer_digests
    for name in ("busybox-zstd", "multilayer-zstd"):
        pushed, built = images[name], fixture_layouts_built.images[name]
        assert pushed.digest == built.digest
        assert pushed.layer_media_types == (MEDIA_LAYER_ZSTD,) * len(pushed.layer_digests)
        assert pushed.diff_ids == images[name.removesuffix("-zstd")].diff_ids
    assert blob_bytes(images["busybox-zstd"],
                      images["busybox-zstd"].layer_digests[0])[:4] == b"\x28\xb5\x2f\xfd"
    assert images["busybox-v2s2"].media_type == MEDIA_V2S2
    assert images["busybox-v2s2"].diff_ids == source.diff_ids
    assert images["multilayer"].media_type == MEDIA_MANIFEST
    assert len(images["multilayer"].layer_digests) == 5
    assert images["multiarch"].media_type == MEDIA_INDEX
    assert images["multiarch"].digest == fixture_layouts_built.images["multiarch"].digest
    assert set(images["multiarch"].platforms) == {"linux/amd64", "linux/arm64/v8"}
    assert images["multiarch-v2s2"].media_type == MEDIA_DOCKER_LIST
    assert set(images["multiarch-v2s2"].platforms) == {"linux/amd64", "linux/arm64/v8"}


def test_tls_registry_needs_its_ca(images: dict[str, ImageRef]) -> None:
    image = images["tls/busybox"]
    assert image.registry.url.startswith("https://")
    untrusted = skopeo("inspect", "--raw", "--tls-verify=true", f"docker://{image.ref}")
    assert untrusted.returncode != 0
    assert "certificate" in untrusted.stderr
    assert inspect(image, "--raw").returncode == 0


def test_htpasswd_registry_requires_credentials(images: dict[str, ImageRef]) -> None:
    image = images["htpasswd/busybox"]
    anonymous = inspect(image, "--raw", creds=False)
    assert anonymous.returncode != 0
    wrong = inspect(image, "--raw", "--creds", f"{HTPASSWD_USER}:wrong", creds=False)
    assert wrong.returncode != 0
    assert inspect(image, "--raw").returncode == 0
    status, headers, _ = get(f"{image.registry.url}/v2/")
    assert status == 401
    assert headers["Www-Authenticate"].startswith("Basic ")
    auth = base64.b64encode(f"{HTPASSWD_USER}:{HTPASSWD_PASSWORD}".encode()).decode()
    assert get(f"{image.registry.url}/v2/", {"Authorization": f"Basic {auth}"})[0] == 200


def test_token_registry_public_repo_is_anonymous(images: dict[str, ImageRef]) -> None:
    assert inspect(images["token/public"], "--raw", creds=False).returncode == 0


def test_token_registry_private_repo_needs_credentials(images: dict[str, ImageRef],
                                                       token_issuer: TokenIssuer) -> None:
    image = images["token/private"]
    anonymous = inspect(image, "--raw", creds=False)
    assert anonymous.returncode != 0
    assert "unauthorized" in anonymous.stderr or "denied" in anonymous.stderr
    wrong = inspect(image, "--raw", "--creds", f"{TOKEN_USER}:wrong", creds=False)
    assert wrong.returncode != 0
    assert inspect(image, "--raw").returncode == 0
    assert any(r.account == TOKEN_USER and r.status == 200 for r in token_issuer.requests)
    assert any(r.account == TOKEN_USER and r.status == 401 for r in token_issuer.requests)


def test_token_dance_by_hand(images: dict[str, ImageRef]) -> None:
    """The challenge names the realm/service/scope; only an authorized token opens the repo."""
    image = images["token/private"]
    url = f"{image.registry.url}/v2/{image.repository}/manifests/{image.tag}"
    accept = {"Accept": MEDIA_MANIFEST}
    status, headers, _ = get(url, accept)
    assert status == 401
    challenge = headers["Www-Authenticate"]
    assert challenge.startswith("Bearer ")
    params = dict(part.split("=", 1) for part in challenge[len("Bearer "):].split('",'))
    params = {k: v.strip('"') for k, v in params.items()}
    assert params["scope"] == f"repository:{image.repository}:pull"
    token_url = f"{params['realm']}?service={params['service']}&scope={params['scope']}"
    with urllib.request.urlopen(token_url, timeout=10) as response:
        anonymous_token = json.loads(response.read())["token"]
    assert get(url, {**accept, "Authorization": f"Bearer {anonymous_token}"})[0] == 401
    basic = base64.b64encode(f"{TOKEN_USER}:{TOKEN_PASSWORD}".encode()).decode()
    request = urllib.request.Request(token_url, headers={"Authorization": f"Basic {basic}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = json.loads(response.read())
    assert body["access_token"] == body["token"] and body["expires_in"] > 0
    status, _, manifest = get(url, {**accept, "Authorization": f"Bearer {body['token']}"})
    assert status == 200
    assert "sha256:" + hashlib.sha256(manifest).hexdigest() == image.digest


# --- fault proxy --------------------------------------------------------------------------------

def _layer(images: dict[str, ImageRef]) -> tuple[ImageRef, str, bytes]:
    image = images["busybox"]
    digest = image.layer_digests[0]  # the ~1 MB busybox layer
    return image, digest, blob_bytes(image, digest)


def test_proxy_passes_through_and_counts(images: dict[str, ImageRef],
                                         fault_proxy: FaultProxy) -> None:
    image, digest, expected = _layer(images)
    status, headers, body = get(blob_url(fault_proxy.url, image, digest))
    assert status == 200 and body == expected
    assert headers["Docker-Content-Digest"] == digest
    status, _, partial = get(blob_url(fault_proxy.url, image, digest), {"Range": "bytes=100-"})
    assert status == 206 and partial == expected[100:]
    assert fault_proxy.count(digest) == 2
    assert fault_proxy.counts()[f"/v2/{image.repository}/blobs/{digest}"] == 2
    assert fault_proxy.requests[1].headers["Range"] == "bytes=100-"
    assert fault_proxy.bytes_sent == len(expected) + len(expected) - 100
    fault_proxy.clear()
    assert fault_proxy.bytes_sent == 0


def test_proxy_drops_connection_mid_body(images: dict[str, ImageRef],
                                         fault_proxy: FaultProxy) -> None:
    image, digest, expected = _layer(images)
    fault_proxy.add(Fault(r"/blobs/sha256:", "drop", after_bytes=1000))
    parts = urlsplit(fault_proxy.url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=30)
    conn.request("GET", urlsplit(blob_url(fault_proxy.url, image, digest)).path)
    response = conn.getresponse()
    assert response.status == 200
    assert int(response.getheader("Content-Length") or 0) == len(expected)
    with pytest.raises(http.client.IncompleteRead) as excinfo:
        response.read()
    assert excinfo.value.partial == expected[:1000]
    conn.close()
    assert get(blob_url(fault_proxy.url, image, digest))[2] == expected  # only once


def test_proxy_stalls_until_released(images: dict[str, ImageRef],
                                     fault_proxy: FaultProxy) -> None:
    image, digest, expected = _layer(images)
    fault_proxy.add(Fault(r"/blobs/", "stall", after_bytes=2000))
    conn = http.client.HTTPConnection(urlsplit(fault_proxy.url).netloc, timeout=30)
    conn.request("GET", urlsplit(blob_url(fault_proxy.url, image, digest)).path)
    response = conn.getresponse()
    assert response.read(2000) == expected[:2000]
    releaser = threading.Timer(0.5, fault_proxy.release_stalled)
    started = time.monotonic()
    releaser.start()
    with pytest.raises(http.client.IncompleteRead):
        response.read()
    assert time.monotonic() - started >= 0.4  # nothing arrived while stalled
    conn.close()
    releaser.join()
    assert get(blob_url(fault_proxy.url, image, digest))[2] == expected


def test_proxy_truncates_body(images: dict[str, ImageRef], fault_proxy: FaultProxy) -> None:
    image, digest, expected = _layer(images)
    fault_proxy.add(Fault(r"/blobs/", "truncate", after_bytes=4096))
    status, headers, body = get(blob_url(fault_proxy.url, image, digest))
    assert status == 200 and body == expected[:4096]
    assert headers["Content-Length"] == "4096"


def test_proxy_flips_one_byte(images: dict[str, ImageRef], fault_proxy: FaultProxy) -> None:
    image, digest, expected = _layer(images)
    offset = len(expected) // 2
    fault_proxy.add(Fault(r"/blobs/", "flip", after_bytes=offset))
    _, _, body = get(blob_url(fault_proxy.url, image, digest))
    assert len(body) == len(expected)
    assert [i for i, (a, b) in enumerate(zip(body, expected, strict=True)) if a != b] == [offset]


@pytest.mark.parametrize(("status", "retry_after"), [(429, "2"), (503, None)])
def test_proxy_answers_status_for_first_n(images: dict[str, ImageRef], fault_proxy: FaultProxy,
                                          status: int, retry_after: str | None) -> None:
    image = images["busybox"]
    fault_proxy.add(Fault(r"/manifests/", "status", status=status, retry_after=retry_after,
                          times=2))
    url = f"{fault_proxy.url}/v2/{image.repository}/manifests/{image.tag}"
    accept = {"Accept": MEDIA_MANIFEST}
    for _ in range(2):
        got, headers, _ = get(url, accept)
        assert got == status
        assert headers.get("Retry-After") == retry_after
    got, _, body = get(url, accept)
    assert got == 200
    assert "sha256:" + hashlib.sha256(body).hexdigest() == image.digest
    assert [r.fault for r in fault_proxy.requests] == ["status", "status", None]


def test_proxy_answers_502_when_upstream_is_gone() -> None:
    with running_fault_proxy(f"http://127.0.0.1:{components.free_port()}") as proxy:
        status, _, _ = get(f"{proxy.url}/v2/")
        assert status == 502
        assert [r.status for r in proxy.requests] == [502]


def test_skopeo_pulls_through_proxy_fetching_each_blob_once(
        images: dict[str, ImageRef], fault_proxy: FaultProxy, tmp_path: Path) -> None:
    image = images["multilayer"]
    result = skopeo("copy", "--src-tls-verify=false", f"docker://{image.via(fault_proxy.host)}",
                    f"oci:{tmp_path / 'copy'}:x")
    assert result.returncode == 0, result.stderr
    for digest in (*image.layer_digests, image.config_digest or ""):
        assert fault_proxy.count(f"/blobs/{digest}$") == 1


def test_skopeo_pushes_through_proxy(images: dict[str, ImageRef], fault_proxy: FaultProxy,
                                     fixture_layouts_built: FixtureLayouts) -> None:
    """Request bodies (blob uploads, manifests) stream through; upload URLs point back at us."""
    target = f"docker://{fault_proxy.host}/pushed-through-proxy/multilayer:latest"
    result = skopeo("copy", "--dest-tls-verify=false",
                    fixture_layouts_built.oci_ref("multilayer"), target)
    assert result.returncode == 0, result.stderr
    assert fault_proxy.count(r"/blobs/uploads/", ("POST",)) >= 1
    assert fault_proxy.count(r"/manifests/latest$", ("PUT",)) == 1
    check = skopeo("inspect", "--raw", "--tls-verify=false",
                   f"docker://{images['multilayer'].registry.host}/pushed-through-proxy/"
                   "multilayer:latest")
    assert check.returncode == 0, check.stderr
    digest = "sha256:" + hashlib.sha256(check.stdout.encode()).hexdigest()
    assert digest == fixture_layouts_built.images["multilayer"].digest


# --- the CLI runner -----------------------------------------------------------------------------

def test_ocistage_runner_isolates_environment(ocistage: OcistageRunner) -> None:
    env = ocistage.environment({"EXTRA": "1"})
    assert env["OCISTAGE_CACHE"] == str(ocistage.cache)
    assert env["HOME"] == str(ocistage.home)
    assert "REGISTRY_AUTH_FILE" not in env and "DOCKER_CONFIG" not in env
    assert env["EXTRA"] == "1"


def test_fault_proxy_in_front_of_tls_registry(images: dict[str, ImageRef],
                                             make_fault_proxy: Callable[[Registry], FaultProxy]
                                             ) -> None:
    image = images["tls/busybox"]
    proxy = make_fault_proxy(image.registry)
    proxy.add(Fault(r"/manifests/", "status", status=503))
    url = f"{proxy.url}/v2/{image.repository}/manifests/{image.tag}"
    assert get(url, {"Accept": MEDIA_MANIFEST})[0] == 503
    status, _, body = get(url, {"Accept": MEDIA_MANIFEST})
    assert status == 200
    assert "sha256:" + hashlib.sha256(body).hexdigest() == image.digest


def test_write_docker_auth(ocistage: OcistageRunner, htpasswd_registry: Registry) -> None:
    path = ocistage.write_docker_auth(htpasswd_registry)
    config = json.loads(path.read_text())
    encoded = config["auths"][htpasswd_registry.host]["auth"]
    assert base64.b64decode(encoded).decode() == f"{HTPASSWD_USER}:{HTPASSWD_PASSWORD}"
    assert path.stat().st_mode & 0o777 == 0o600
    skopeo_auth = skopeo("inspect", "--raw", "--tls-verify=false", "--authfile", str(path),
                         f"docker://{htpasswd_registry.host}/private/busybox:latest")
    assert skopeo_auth.returncode == 0, skopeo_auth.stderr


def test_ocistage_cli_smoke(ocistage: OcistageRunner) -> None:
    result = ocistage("--help")
    assert result.returncode == 0, result.stderr
    for command in ("pull", "bundle", "inspect"):
        assert command in result.stdout
