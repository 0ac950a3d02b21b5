"""Names from images reach mksquashfs pseudo definitions as data, never as definitions
(issue 39): every byte escaped (:func:`ocistage.stagers.mksquashfs.pseudo_name`), held against
the real mksquashfs and unsquashfs. The first test is the attack as it was reported: an image's
WorkingDir ran a shell command on the host through ``ocistage-pyxis-importer``."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ocistage.bundler.pyxis.enroot_files import enroot_files
from ocistage.bundler.pyxis.mksquashfs import mksquashfs_argv
from ocistage.stagers.errors import PseudoNameError
from ocistage.stagers.mksquashfs import NAME_MAX, pseudo_dir, pseudo_file, pseudo_name
from ocistage.stagers.squashfs import build_image
from ocistage.stagers.squashfs_compression import Compression
from pytest_ocistage.components import require_binary


def _extracted(image: Path, dest: Path) -> Path:
    """``image`` unpacked into ``dest`` (which must not exist) by the real unsquashfs."""
    subprocess.run([require_binary("unsquashfs", "squashfs-tools"), "-no-progress", "-d",
                    os.fspath(dest), os.fspath(image)], check=True, capture_output=True,
                   timeout=120)
    return dest


def _files(tmp_path: Path, config: dict[str, object]) -> tuple[dict[str, Path], str]:
    files, workdir = enroot_files(config)
    written = {}
    for n, (inside, data) in enumerate(sorted(files.items())):
        written[inside] = tmp_path / f"file{n}"
        written[inside].write_bytes(data)
    return written, workdir


@pytest.mark.parametrize("form", [
    "/x f 644 0 0 sh -c 'touch {canary}' #",        # the report: a file from a command
    '/x" f 644 0 0 touch {canary} #',                 # a quote closing the name early
    "/a\\ b f 644 0 0 touch {canary} #",              # an escaped space in the image's text
    "/y\n/z f 644 0 0 touch {canary}",                # a second line
])
def test_an_images_workdir_runs_no_command_on_the_host(tmp_path: Path, form: str) -> None:
    mksquashfs = require_binary("mksquashfs", "squashfs-tools")
    canary = tmp_path / "PWNED"
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    workdir_in = form.format(canary=canary)
    # enroot's files refuse some of these WorkingDirs themselves (bundler/pyxis/enroot_files.py);
    # the pseudo definitions must carry every one whatever the layer above lets through
    written, _ = _files(tmp_path, {"config": {}})
    image = tmp_path / "image.sqsh"
    argv = mksquashfs_argv(mksquashfs, rootfs, image, written, workdir_in, Compression("gzip"),
                           1)
    subprocess.run(argv, check=True, capture_output=True, timeout=120, cwd=tmp_path)
    assert not canary.exists()
    tree = _extracted(image, tmp_path / "out")
    made = tree.joinpath(*[p for p in workdir_in.split("/") if p])
    assert made.is_dir() and not made.is_symlink()
    assert sorted(p.name for p in tree.iterdir()) == sorted(
        {"etc", workdir_in.split("/")[1]})


#: characters mksquashfs's pseudo language gives a meaning to, and others an image may hold
_SPECIAL = " \t\n\r\v\f\"'\\#;$`|&<>()*?[]{}~!=%-"
_names = st.text(alphabet=st.sampled_from(_SPECIAL) | st.characters(
    min_codepoint=1, max_codepoint=0x2fff, blacklist_categories=("Cs",), blacklist_characters="/"),
    min_size=1, max_size=24).filter(lambda n: n not in (".", ".."))
_raw = st.binary(min_size=1, max_size=12).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b".."))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(_names | _raw.map(os.fsdecode), min_size=1, max_size=6,
                      unique_by=os.fsencode))
def test_every_name_becomes_that_entry_and_nothing_else(tmp_path: Path, names: list[str]) -> None:
    """One directory per definition, named byte for byte as asked, and one file per ``f``
    definition whose content is what our own command printed: no definition splits, joins or
    runs anything else."""
    mksquashfs = require_binary("mksquashfs", "squashfs-tools")
    base = Path(tempfile.mkdtemp(dir=tmp_path))  # hypothesis reuses tmp_path per example
    (base / "root").mkdir()
    argv = [mksquashfs, os.fspath(base / "root"), os.fspath(base / "img"), "-noappend",
            "-quiet", "-no-progress", "-comp", "gzip"]
    for name in names:
        argv += ["-p", pseudo_dir(["d", name], 0o755, 0, 0),
                 "-p", pseudo_file(["f", name], 0o644, 0, 0, "echo made")]
    argv += ["-p", pseudo_dir(["d"], 0o755, 0, 0), "-p", pseudo_dir(["f"], 0o755, 0, 0)]
    # the definitions of the parents go last: mksquashfs takes them in any order
    subprocess.run(argv, check=True, capture_output=True, timeout=120, cwd=base)
    tree = _extracted(base / "img", base / "out")
    expected = sorted(os.fsencode(n) for n in names)
    assert sorted(os.listdir(os.fsencode(tree / "d"))) == expected
    assert sorted(os.listdir(os.fsencode(tree / "f"))) == expected
    for name in names:
        assert (tree / "d" / name).is_dir()
        assert (tree / "f" / name).read_bytes() == b"made\n"
    assert sorted(os.listdir(tree)) == ["d", "f"]
    assert sorted(os.listdir(base)) == ["img", "out", "root"]


@pytest.mark.parametrize("parts", [
    [], [""], ["."], [".."], ["a", ".."], ["a/b"], ["nul\0byte"], ["lone\ud800surrogate"],
    ["x" * (NAME_MAX + 1)], ["é" * (NAME_MAX // 2 + 1)]])
def test_names_no_definition_can_carry_are_refused(parts: list[str]) -> None:
    with pytest.raises(PseudoNameError) as caught:
        pseudo_name(parts)
    assert caught.value.hint


def test_a_longest_name_is_carried() -> None:
    assert pseudo_name(["x" * NAME_MAX]).count("x") == NAME_MAX


def test_a_workdir_with_a_nul_is_refused_before_any_path_is_looked_at(tmp_path: Path) -> None:
    (tmp_path / "rootfs").mkdir()
    with pytest.raises(PseudoNameError):
        mksquashfs_argv("mksquashfs", tmp_path / "rootfs", tmp_path / "img", {}, "/a\0b",
                        Compression("gzip"), 1)


def test_a_mount_point_with_white_space_is_in_the_staged_image(tmp_path: Path) -> None:
    """``stage --format squashfs`` used to skip such a mount point (runc then failed on the
    read-only image); it is carried like any other name now."""
    require_binary("mksquashfs", "squashfs-tools")
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    hostile = "data dir\n#x f 644 0 0 touch PWNED"
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, "mounts": [
        {"destination": "/" + hostile, "type": "tmpfs", "source": "tmpfs"}]}))
    build_image(bundle, tmp_path / "img.sqfs", jobs=1)
    tree = _extracted(tmp_path / "img.sqfs", tmp_path / "out")
    assert (tree / "rootfs" / hostile).is_dir()
    assert not (tmp_path / "PWNED").exists() and not (bundle / "PWNED").exists()
