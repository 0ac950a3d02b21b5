"""ocistage.bundler.flows.stage.stage: one entry point; anything that looks like a path is a
path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocistage.bundler.flows.stage import Staged, StageOptions, default_name, stage
from ocistage.cache.store import Store
from ocistage.errors import UsageError
from ocistage.stagers.errors import StageError
from ocistage.stagers.target import StageResult
from tests.stagers.conftest import make_tree


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "bundle")


def _stage(what: str, tmp_path: Path, **options: object) -> Staged:
    to = str(options.pop("to", tmp_path / "t"))
    return stage(what, StageOptions(to=to, pin="test", **options),  # type: ignore[arg-type]
                 store=Store.open(tmp_path / "cache"))


@pytest.mark.parametrize("what", ["./mybundel", "/nonexistent/dir", "~/no-such-bundle-here",
                                  "mybundel/", "../mybundel"])
def test_a_path_that_is_no_directory_says_so(what: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StageError, match="no such directory"):
        _stage(what, tmp_path)


def test_a_path_below_a_directory_here_is_a_path(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StageError, match="no such directory: work/mybundel"):
        _stage("work/mybundel", tmp_path)


def test_a_file_is_not_a_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "image.tar").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StageError, match=r"\./image\.tar is not a directory"):
        _stage("./image.tar", tmp_path)


@pytest.mark.parametrize("what", ["mybundel", "library/mybundel", "mybundel:1.0"])
def test_a_bare_name_is_not_sent_to_docker_hub(what: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StageError, match=f"no such directory: {what}") as caught:
        _stage(what, tmp_path)
    assert "docker.io/library/mybundel" in str(caught.value.hint)
    assert "docker://" in str(caught.value.hint)
    assert not (tmp_path / "cache" / "blobs" / "sha256").exists() or not os.listdir(
        tmp_path / "cache" / "blobs" / "sha256")


def test_a_directory_is_staged_and_the_label_is_its_path(tree: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree.parent)
    staged = _stage(f"./{tree.name}", tmp_path)
    assert isinstance(staged.outcome, StageResult)
    assert staged.outcome.path == tmp_path / "t" / tree.name
    assert staged.label == os.fspath(tree)


def test_unknown_format_is_a_usage_error(tree: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown format"):
        _stage(os.fspath(tree), tmp_path, format="zip")


def test_a_url_cannot_be_staged_to_a_url(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="to another URL"):
        _stage("file:///a/b.sqfs", tmp_path, to="memory://x")


@pytest.mark.parametrize(("ref", "name"), [
    ("docker.io/library/debian:bookworm", "debian+bookworm"),
    ("debian", "debian+latest"),
    ("localhost:5000/team/app:1.2", "team+app+1.2"),
    ("ghcr.io/org/tool@sha256:" + "ab" * 32, "org+tool+sha256-abababababab"),
    ("oci:/images/app:v2", "app+v2"),
    ("oci-archive:/images/app.tar:v2", "app+v2"),
    ("docker-archive:/images/save.tar:myorg/tool:3", "myorg+tool+3"),
    ("docker-archive:/images/save.tar", "save"),
])
def test_a_ref_is_staged_under_its_repository_and_tag(ref: str, name: str) -> None:
    from ocistage.bundler.image.reference import parse_reference

    assert default_name(parse_reference(ref)) == name


def test_a_new_image_of_a_tag_replaces_the_staged_one(tmp_path: Path) -> None:
    """Without --name, a re-stage of a tag that now names a newer image replaces what was
    staged under it, instead of adding a directory per version."""
    from tests.bundler.tarbuilder import build_tar, file, write_oci_layout

    layout = tmp_path / "app"
    staged = []
    for content in (b"one", b"two"):
        write_oci_layout(layout, [build_tar([file("version", content)])], tag="v1",
                         container={"Cmd": ["/bin/sh"]})
        staged.append(_stage(f"oci:{layout}:v1", tmp_path))
    paths = [s.outcome.path for s in staged if isinstance(s.outcome, StageResult)]
    assert paths == [tmp_path / "t" / "app+v1"] * 2
    assert (paths[0] / "rootfs" / "version").read_bytes() == b"two"
    assert sorted(p.name for p in (tmp_path / "t").iterdir() if not p.name.startswith(".")) \
        == ["app+v1"]
    named = _stage(f"oci:{layout}:v1", tmp_path, name="pinned")
    assert isinstance(named.outcome, StageResult)
    assert named.outcome.path == tmp_path / "t" / "pinned"
