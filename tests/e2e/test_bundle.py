"""`ocistage bundle` end to end: same tree as `skopeo copy` + `umoci unpack --rootless` of the
same image from the real registry, and the bundle runs under rootless runc as the image says."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from pytest_ocistage.bundles import run_bundle
from pytest_ocistage.components import require_binary
from pytest_ocistage.images import ImageRef
from tests.bundler.tarbuilder import Node, add_mount_points, snapshot
from tests.e2e.conftest import OcistageRunner
from tests.e2e.terminal import run_on_terminal

# zstd forms hold the same content as their gzip twins; umoci 0.4 cannot read zstd layers, so
# their reference tree is umoci's unpack of the gzip twin.
REFERENCE_OF = {"busybox-zstd": "busybox", "multilayer-zstd": "multilayer"}


def umoci_tree(image: ImageRef, workdir: Path) -> Path:
    layout = workdir / "skopeo-layout"
    subprocess.run(["skopeo", "copy", "-q", *image.registry.skopeo_flags("src-"),
                    f"docker://{image.ref}", f"oci:{layout}:x"], check=True)
    bundle = workdir / "umoci-bundle"
    subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{layout}:x", str(bundle)],
                   check=True, capture_output=True)
    return bundle / "rootfs"


def normalise_umoci(tree: dict[str, Node]) -> dict[str, Node]:
    """Apply our documented, deliberate differences to umoci's tree (docs/layers.md):

    - rootless directories keep u+rwx so the bundle can always be deleted;
    - umoci records the image's owner of non-root files in a ``user.rootlesscontainers``
      xattr (its own bookkeeping, not image content); we map the image user in config.json;
    - the bundle's mount points (:func:`tests.bundler.tarbuilder.add_mount_points`, given to
      umoci's tree on disk before it is read).
    """
    result = {}
    for name, (kind, mode, content, attrs, *rest) in tree.items():
        if stat.S_ISDIR(kind):
            mode |= 0o700
        if isinstance(attrs, tuple):
            attrs = tuple(a for a in attrs if a[0] != "user.rootlesscontainers")
        result[name] = (kind, mode, content, attrs, *rest)
    return result


def bundle_of(ocistage: OcistageRunner, ref: str, dest: Path, *extra: str) -> Path:
    result = ocistage("bundle", *extra, ref, str(dest), check=True)
    assert result.stdout.strip() == str(dest)
    return dest


@pytest.mark.parametrize("name", ["busybox", "busybox-zstd", "busybox-v2s2", "multilayer",
                                  "multilayer-zstd"])
def test_rootfs_equals_umoci_unpack_rootless(images: dict[str, ImageRef],
                                             ocistage: OcistageRunner, tmp_path: Path,
                                             name: str) -> None:
    require_binary("umoci")
    require_binary("skopeo")
    image = images[name]
    reference = images[REFERENCE_OF.get(name, name)]
    theirs = normalise_umoci(snapshot(add_mount_points(umoci_tree(reference, tmp_path))))
    ours = snapshot(bundle_of(ocistage, image.ref, tmp_path / "ours") / "rootfs")
    assert ours.keys() == theirs.keys()
    different = {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}
    assert different == {}


def test_multilayer_semantics_are_visible_in_the_bundle(images: dict[str, ImageRef],
                                                        ocistage: OcistageRunner,
                                                        tmp_path: Path) -> None:
    rootfs = bundle_of(ocistage, images["multilayer"].ref, tmp_path / "b") / "rootfs"
    names = {str(p.relative_to(rootfs)) for p in rootfs.rglob("*")}
    assert not any(Path(n).name.startswith(".wh.") for n in names), "whiteouts leaked"
    setuid = [n for n in names if (rootfs / n).is_file() and not (rootfs / n).is_symlink()
              and (rootfs / n).stat().st_mode & stat.S_ISUID]
    assert setuid, "setuid bits must be kept as in the image"
    fifos = [n for n in names if stat.S_ISFIFO((rootfs / n).lstat().st_mode)]
    assert fifos
    # every directory stays deletable by its owner
    for directory in [rootfs, *(p for p in rootfs.rglob("*") if p.is_dir() and not p.is_symlink())]:
        assert directory.lstat().st_mode & 0o700 == 0o700


def test_bundle_runs_as_the_image_says(images: dict[str, ImageRef], ocistage: OcistageRunner,
                                       tmp_path: Path) -> None:
    bundle = bundle_of(ocistage, images["busybox"].ref, tmp_path / "b")
    result = run_bundle(bundle, tmp_path / "runc-state")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hello from busybox"
    config = json.loads((bundle / "config.json").read_text())
    assert config["process"]["cwd"] == "/home/app"
    assert "GREETING=hello world" in config["process"]["env"]


def test_bundle_overrides_reach_the_process(images: dict[str, ImageRef],
                                            ocistage: OcistageRunner, tmp_path: Path) -> None:
    report = "id -un; id -u; id -g; pwd; echo $GREETING; echo $EXTRA; cat /etc/os-release"
    bundle = bundle_of(ocistage, images["busybox"].ref, tmp_path / "b",
                       "--cmd", report, "--env", "EXTRA=from-the-cli")
    result = run_bundle(bundle, tmp_path / "runc-state")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:6] == ["app", "1000", "1000", "/home/app", "hello world", "from-the-cli"]
    assert any(line.startswith("NAME=") for line in lines[6:])


def test_readonly_bundle_refuses_writes(images: dict[str, ImageRef], ocistage: OcistageRunner,
                                        tmp_path: Path) -> None:
    bundle = bundle_of(ocistage, images["busybox"].ref, tmp_path / "b", "--readonly",
                       "--map-root", "--cmd", "touch /newfile && echo wrote || echo refused")
    result = run_bundle(bundle, tmp_path / "runc-state")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "refused"


def test_cached_bundle_is_reused(images: dict[str, ImageRef], ocistage: OcistageRunner) -> None:
    image = images["multilayer"]
    first = json.loads(ocistage("bundle", "--json", image.ref, check=True).stdout)
    second = json.loads(ocistage("bundle", "--json", image.ref, check=True).stdout)
    assert first["path"] == second["path"]
    assert Path(first["path"]).parent == ocistage.cache / "bundles"
    assert (first["reused"], second["reused"]) == (False, True)
    # a cached bundle shares file inodes with the cache's snapshot: its root is read-only
    config = json.loads((Path(first["path"]) / "config.json").read_text())
    assert config["root"]["readonly"] is True
    other = json.loads(ocistage("bundle", "--json", "--env", "A=1", image.ref, check=True).stdout)
    assert other["path"] != first["path"]


def test_bundle_errors(images: dict[str, ImageRef], ocistage: OcistageRunner,
                       tmp_path: Path) -> None:
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "file").write_text("x")
    result = ocistage("bundle", images["busybox"].ref, str(occupied))
    assert result.returncode == 2
    assert "not an empty directory" in result.stderr
    assert (occupied / "file").read_text() == "x"
    bad_env = ocistage("bundle", "--env", "=nope", images["busybox"].ref, str(tmp_path / "x"))
    assert bad_env.returncode == 2
    assert not (tmp_path / "x").exists()
    assert not [p for p in tmp_path.iterdir() if ".ocistage-" in p.name], "scratch left behind"


def test_bundle_dir_is_deletable_by_an_unprivileged_owner(images: dict[str, ImageRef],
                                                          ocistage: OcistageRunner,
                                                          tmp_path: Path) -> None:
    bundle = bundle_of(ocistage, images["multilayer"].ref, tmp_path / "b")
    if os.geteuid() == 0:
        # root can delete anything; check the modes that let an owner do it instead
        for path in [bundle, *bundle.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                assert path.stat().st_mode & 0o700 == 0o700, path
    subprocess.run(["rm", "-rf", str(bundle)], check=True)
    assert not bundle.exists()


def test_link_bundle_shares_the_snapshot_read_only(images: dict[str, ImageRef],
                                                   ocistage: OcistageRunner,
                                                   tmp_path: Path) -> None:
    image = images["busybox"]
    copy = bundle_of(ocistage, image.ref, tmp_path / "copy")
    linked = bundle_of(ocistage, image.ref, tmp_path / "linked", "--link")
    def tree(root: Path) -> dict[str, Node]:  # without in-tree hardlink groups: every linked
        return {k: v[:5] for k, v in snapshot(root, xattrs=False).items()}  # file has nlink 2

    assert tree(copy / "rootfs") == tree(linked / "rootfs")
    busybox = linked / "rootfs/bin/busybox"
    assert busybox.stat().st_nlink > 1  # shared with the cache's snapshot
    assert (copy / "rootfs/bin/busybox").stat().st_nlink == 1
    assert json.loads((linked / "config.json").read_text())["root"]["readonly"] is True
    assert json.loads((copy / "config.json").read_text())["root"]["readonly"] is False
    result = run_bundle(linked, tmp_path / "runc-state")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hello from busybox"


def test_download_bars_on_a_terminal(images: dict[str, ImageRef], ocistage: OcistageRunner,
                                     tmp_path: Path) -> None:
    """On a terminal a cold bundle draws its download bars (rich, handed the real console:
    the lazily made one is no context manager) and ends with its summary line."""
    image = images["multilayer"]
    code, shown = run_on_terminal(
        [*ocistage.command, "bundle", image.ref, str(tmp_path / "b")],
        ocistage.environment({"TERM": "xterm", "COLUMNS": "100"}), ocistage.cwd)
    assert code == 0, shown
    assert b"made bundle of" in shown
    assert (tmp_path / "b" / "config.json").is_file()
