"""imagebuild: any layer spec gives the same digests on every build, and the tar it describes."""

from __future__ import annotations

import gzip
import json
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_ocistage.imagebuild import (
    OPAQUE,
    WHITEOUT,
    Dir,
    Entry,
    File,
    Hardlink,
    Symlink,
    build_image,
)

names = st.text(alphabet="abcxyz-_.", min_size=1, max_size=6).filter(
    lambda n: n not in (".", "..") and not n.startswith(".wh."))
paths = st.lists(names, min_size=1, max_size=3).map("/".join)
entries: st.SearchStrategy[Entry] = st.one_of(
    st.binary(max_size=64), st.text(max_size=32),
    st.builds(File, st.binary(max_size=64), st.sampled_from([0o644, 0o755, 0o4755, 0o600])),
    st.builds(Dir, st.sampled_from([0o755, 0o700, 0o1777]), st.integers(0, 2000)),
    st.builds(Symlink, st.sampled_from(["a", "/etc/shadow", "../../x"])),
    st.just(WHITEOUT), st.just(OPAQUE))
layers = st.lists(st.dictionaries(paths, entries, max_size=6), min_size=1, max_size=3)


def tar_names(layout: Path, digest: str) -> list[str]:
    with gzip.open(layout / "blobs" / "sha256" / digest[7:]) as stream, \
            tarfile.open(fileobj=stream, mode="r|") as tar:
        return [member.name for member in tar]


@settings(max_examples=25, deadline=None)
@given(layers)
def test_a_spec_builds_the_same_image_every_time(spec: list[dict[str, Entry]]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        first = build_image(Path(scratch) / "one", spec, cmd=["/x"], env={"A": "b"})
        second = build_image(Path(scratch) / "two", spec, cmd=["/x"], env={"A": "b"})
        assert first.digest == second.digest
        assert first.layer_digests == second.layer_digests
        for layer_spec, digest in zip(spec, first.layer_digests, strict=True):
            written = tar_names(first.layout, digest)
            for path, entry in layer_spec.items():
                head, _, leaf = path.rpartition("/")
                prefix = f"{head}/" if head else ""
                expected = (f"{prefix}.wh.{leaf}" if entry is WHITEOUT
                            else f"{path}/.wh..wh..opq" if entry is OPAQUE else path)
                assert expected in written


def test_the_config_says_what_was_asked(tmp_path: Path) -> None:
    image = build_image(tmp_path / "layout", [{"a": "b"}], entrypoint=["/bin/sh", "-c"],
                        cmd=["echo hi"], env=["X=1"], user="1000:1000", workdir="/w",
                        labels={"k": "v"})
    manifest = json.loads((tmp_path / "layout/blobs/sha256" / image.digest[7:]).read_bytes())
    config = json.loads(
        (tmp_path / "layout/blobs/sha256" / manifest["config"]["digest"][7:]).read_bytes())
    assert config["config"] == {
        "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo hi"], "User": "1000:1000",
        "WorkingDir": "/w", "Labels": {"k": "v"},
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "X=1"]}
    assert config["rootfs"]["diff_ids"] == list(image.diff_ids)


@pytest.mark.parametrize("bad", ["../escape", "a/../../b"])
def test_paths_outside_the_root_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match=r"\.\."):
        build_image(tmp_path / "layout", [{bad: "x"}])


def test_hardlinks_and_parents(tmp_path: Path) -> None:
    image = build_image(tmp_path / "layout", [{"d/e/f": "x"}, {"d/e/g": Hardlink("d/e/f")}])
    assert tar_names(image.layout, image.layer_digests[0]) == ["d", "d/e", "d/e/f"]
    assert tar_names(image.layout, image.layer_digests[1]) == ["d/e/g"]  # parents known
