"""The verifying floor of ``python -m bench`` (bench/floor.py): the real pipeline (curl, tee,
sha256sum, gzip/zstd, tar) on a layer served by ``file://``; nothing is timed."""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from bench.floor import FloorLayer, FloorMismatch, run_layers

pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("bash", "curl", "tee", "sha256sum", "gzip",
                                                 "tar")),
    reason="the floor's tools are not installed")


def _layer(tmp_path: Path) -> tuple[Path, str, str]:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("etc/hello")
        data = b"hello floor\n" * 100
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    blob = gzip.compress(raw.getvalue())
    path = tmp_path / "blob.gz"
    path.write_bytes(blob)
    return (path, "sha256:" + hashlib.sha256(blob).hexdigest(),
            "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest())


def _timed(argv: list[str], first: bool) -> tuple[float, int]:
    subprocess.run(argv, check=True)
    return 0.0, 0


@pytest.mark.parametrize("verify", [True, False])
def test_floor_unpacks_and_keeps_the_blob(tmp_path: Path, verify: bool) -> None:
    path, digest, diff_id = _layer(tmp_path)
    layer = FloorLayer(path.as_uri(), "gzip", digest, diff_id)
    run_layers([layer], tmp_path / "tree", tmp_path / "scratch", verify, _timed)
    assert (tmp_path / "tree/etc/hello").read_bytes() == b"hello floor\n" * 100
    kept = tmp_path / "scratch/layer-0/blob"
    assert kept.is_file() == verify
    if verify:
        assert kept.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("which", ["digest", "diff_id"])
def test_floor_fails_on_a_digest_mismatch(tmp_path: Path, which: str) -> None:
    path, digest, diff_id = _layer(tmp_path)
    wrong = "sha256:" + "0" * 64
    layer = FloorLayer(path.as_uri(), "gzip", wrong if which == "digest" else digest,
                       wrong if which == "diff_id" else diff_id)
    with pytest.raises(FloorMismatch, match="is not sha256:0000"):
        run_layers([layer], tmp_path / "tree", tmp_path / "scratch", True, _timed)
