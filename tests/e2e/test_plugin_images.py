"""The plugin's ``oci_image`` builder: reproducible images that ocistage, skopeo and runc use."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pytest_ocistage import (
    OPAQUE,
    WHITEOUT,
    Dir,
    File,
    Hardlink,
    Symlink,
    build_image,
    busybox_layer,
)
from pytest_ocistage.components import Registry, require_binary
from pytest_ocistage.images import MEDIA_INDEX, MEDIA_LAYER_ZSTD
from pytest_ocistage.plugin import ImageFactory
from pytest_ocistage.runner import OcistageRunner

LOWER = {"data/keep": "kept\n", "data/gone": "whited out\n", "data/dir/inner": "deleted\n",
         "data/opaque/old": "hidden\n", "data/shared": "shared\n",
         "data/private": Dir(0o700, 1000, 1000)}
UPPER = {"data/gone": WHITEOUT, "data/dir": WHITEOUT, "data/opaque": OPAQUE,
         "data/opaque/new": "new\n", "data/link": Symlink("keep"),
         "data/hard": Hardlink("data/shared"),
         "data/script": File("#!/bin/sh\necho ok\n", mode=0o755)}


def bundle(ocistage: OcistageRunner, ref: str, dest: Path) -> Path:
    result = ocistage("bundle", ref, str(dest), check=True)
    assert result.stdout.strip() == str(dest)
    return dest / "rootfs"


def test_the_same_spec_gives_the_same_digests(tmp_path: Path) -> None:
    source = tmp_path / "tree"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "file").write_text("content\n")
    (source / "link").symlink_to("sub/file")
    first = build_image(tmp_path / "one", [LOWER, UPPER, source], cmd=["/bin/sh"],
                        env={"A": "1"}, labels={"l": "v"}, compression="zstd")
    os.utime(source / "sub" / "file", (1, 1))  # times of a source directory do not matter
    second = build_image(tmp_path / "two", [LOWER, UPPER, source], cmd=["/bin/sh"],
                         env={"A": "1"}, labels={"l": "v"}, compression="zstd")
    assert (first.digest, first.layer_digests) == (second.digest, second.layer_digests)
    other = build_image(tmp_path / "three", [LOWER, UPPER, source], cmd=["/bin/sh"],
                        env={"A": "2"}, labels={"l": "v"}, compression="zstd")
    assert other.digest != first.digest and other.layer_digests == first.layer_digests
    one, two = (tmp_path / "one.tar", tmp_path / "two.tar")
    first.write_archive(one)
    second.write_archive(two)
    assert one.read_bytes() == two.read_bytes()


@pytest.mark.parametrize("compression", ["gzip", "zstd", "none"])
def test_layers_apply_with_whiteouts_links_and_modes(oci_image: ImageFactory,
                                                     ocistage: OcistageRunner, tmp_path: Path,
                                                     compression: str) -> None:
    image = oci_image([LOWER, UPPER], compression=compression, cmd=["/data/script"])
    if compression == "zstd":
        manifest = json.loads((image.layout / "blobs/sha256" / image.digest[7:]).read_bytes())
        assert {layer["mediaType"] for layer in manifest["layers"]} == {MEDIA_LAYER_ZSTD}
    rootfs = bundle(ocistage, image.ref, tmp_path / "bundle")
    data = rootfs / "data"
    assert sorted(p.name for p in data.iterdir()) == [
        "hard", "keep", "link", "opaque", "private", "script", "shared"]
    assert os.listdir(data / "opaque") == ["new"]
    assert os.readlink(data / "link") == "keep"
    assert (data / "hard").stat().st_ino == (data / "shared").stat().st_ino
    assert (data / "script").stat().st_mode & 0o777 == 0o755
    assert (data / "private").stat().st_mode & 0o777 == 0o700


def test_a_directory_layer_keeps_modes_links_and_hardlinks(oci_image: ImageFactory,
                                                           ocistage: OcistageRunner,
                                                           tmp_path: Path) -> None:
    source = tmp_path / "tree"
    (source / "bin").mkdir(parents=True)
    (source / "bin" / "tool").write_text("#!/bin/sh\n")
    (source / "bin" / "tool").chmod(0o750)
    os.link(source / "bin" / "tool", source / "bin" / "tool-again")
    (source / "bin" / "alias").symlink_to("tool")
    rootfs = bundle(ocistage, oci_image(source, cmd=["/bin/tool"]).ref, tmp_path / "bundle")
    assert (rootfs / "bin/tool").stat().st_mode & 0o777 == 0o750
    assert (rootfs / "bin/tool").stat().st_ino == (rootfs / "bin/tool-again").stat().st_ino
    assert os.readlink(rootfs / "bin/alias") == "tool"


def test_config_reaches_the_container(oci_image: ImageFactory, ocistage: OcistageRunner,
                                      run_bundle: object, tmp_path: Path) -> None:
    image = oci_image([busybox_layer(), {"home/app": Dir(0o755, 1000, 1000)}],
                      entrypoint=["/bin/sh", "-c"], cmd=["id -un; pwd; echo $GREETING"],
                      env=["GREETING=hi there"], user="app", workdir="/home/app",
                      labels={"org.example.team": "hpc"})
    config = ocistage("inspect", "--json", image.ref, check=True).json
    assert "org.example.team" in json.dumps(config)
    rootfs = bundle(ocistage, image.ref, tmp_path / "bundle")
    assert callable(run_bundle)
    for runtime in ("runc", "crun"):
        run = run_bundle(rootfs.parent, runtime=runtime)
        assert (run.exit_code, run.stdout) == (0, "app\n/home/app\nhi there\n"), run.stderr


def test_run_bundle_reports_the_exit_code(oci_image: ImageFactory, ocistage: OcistageRunner,
                                          run_bundle: object, tmp_path: Path) -> None:
    image = oci_image(busybox_layer(), entrypoint=["/bin/sh", "-c", "echo out; echo err >&2; "
                                                   "exit 7"])
    rootfs = bundle(ocistage, image.ref, tmp_path / "bundle")
    assert callable(run_bundle)
    run = run_bundle(rootfs.parent)
    assert (run.exit_code, run.stdout, run.stderr.strip()) == (7, "out\n", "err")


def test_several_platforms_make_an_index(oci_image: ImageFactory, ocistage: OcistageRunner,
                                         oci_registry: Registry) -> None:
    image = oci_image({"f": "x"}, platforms=["linux/amd64", "linux/arm64/v8"])
    assert image.media_type == MEDIA_INDEX
    assert sorted(image.platforms) == ["linux/amd64", "linux/arm64/v8"]
    pushed = image.push(oci_registry, "plugin/multi")
    assert pushed.digest == image.digest
    report = ocistage("pull", "--json", "--platform", "linux/arm64/v8", pushed.ref,
                      check=True).json
    assert report["digest"] == image.platforms["linux/arm64/v8"]


def test_push_to_every_kind_of_registry(oci_image: ImageFactory, ocistage: OcistageRunner,
                                        oci_registry_tls: Registry,
                                        oci_registry_basic_auth: Registry,
                                        oci_registry_token: Registry, tmp_path: Path) -> None:
    image = oci_image({"hello": "world\n"}, cmd=["/hello"])
    tls = image.push(oci_registry_tls, "plugin/tls")
    ocistage("pull", "--ca-file", str(oci_registry_tls.ca_file), tls.ref, check=True)
    public = image.push(oci_registry_token, "public/plugin")
    ocistage("pull", public.ref, check=True)  # anonymous: public/ is open
    private = image.push(oci_registry_token, "private/plugin")
    basic = image.push(oci_registry_basic_auth, "plugin/basic")
    assert ocistage("pull", private.ref).exit_code == 1
    assert ocistage("pull", basic.ref).exit_code == 1
    ocistage.write_docker_auth(oci_registry_token)
    ocistage.write_docker_auth(oci_registry_basic_auth)
    for ref in (private.ref, basic.ref):
        ocistage("pull", ref, check=True)
    archive = image.write_archive(tmp_path / "image.tar")
    assert bundle(ocistage, archive, tmp_path / "from-archive").joinpath("hello").read_text() \
        == "world\n"


def test_the_image_is_what_skopeo_reads(oci_image: ImageFactory) -> None:
    require_binary("skopeo")
    image = oci_image({"a": "b"}, cmd=["/a"])
    raw = subprocess.run(["skopeo", "inspect", "--config", "--raw", image.ref], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert json.loads(raw)["config"]["Cmd"] == ["/a"]
