"""``stage --to TARGET`` below a co-tenant's directory (issue 27 item 2, docs/trust.md): every
directory above the target is checked, as OpenSSH's StrictModes does; a real second user
(``setpriv``, nobody) makes the directories first."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache.errors import UntrustedPath
from ocistage.cache.leases import Holder
from ocistage.stagers.directory import stage_directory
from tests.cotenant import as_nobody, second_user, sticky_directory

pytestmark = second_user



@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory like ``/tmp``: root's, sticky, every user can make entries in it."""
    with sticky_directory("ocistage-target-") as directory:
        yield directory


@pytest.mark.parametrize("mode", [0o777, 0o755], ids=oct)
def test_a_target_below_a_cotenants_directory_is_refused(tree: Path, tmp_path: Path,
                                                         shared: Path, mode: int) -> None:
    project = shared / "project"
    as_nobody("mkdir", "-m", f"{mode:o}", str(project))
    with pytest.raises(UntrustedPath, match=f"{project} in the sticky directory {shared} is "
                                            "owned by nobody"):
        stage_directory(tree, project / "target", cache_root=tmp_path / "cache",
                        holder=Holder.pin("t"))
    assert os.listdir(project) == []  # nothing made in her directory
    # deeper: the target's parent is root's, but she could move it away with her directory
    (project / "mine").mkdir()
    with pytest.raises(UntrustedPath, match="owned by nobody"):
        stage_directory(tree, project / "mine" / "target", cache_root=tmp_path / "cache",
                        holder=Holder.pin("t"))
    assert os.listdir(project / "mine") == []


def test_a_link_a_cotenant_planted_in_a_sticky_directory_is_not_followed(
        tree: Path, tmp_path: Path, shared: Path) -> None:
    mine = shared / "mine"
    mine.mkdir(mode=0o755)
    as_nobody("ln", "-s", str(mine), str(shared / "link"))
    with pytest.raises(UntrustedPath, match="link in the sticky directory"):
        stage_directory(tree, shared / "link" / "target", cache_root=tmp_path / "cache",
                        holder=Holder.pin("t"))
    assert os.listdir(mine) == []
    # a sticky directory like /tmp is itself a target (its .ocistage-tmp must be ours)
    result = stage_directory(tree, shared, cache_root=tmp_path / "cache", name="app",
                             holder=Holder.pin("t"))
    assert result.path == shared / "app"
