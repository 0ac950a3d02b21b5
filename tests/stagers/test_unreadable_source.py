"""A source file its owner may not read (mode 000: root reads it, a user does not), staged by an
ordinary user to another filesystem: the stage fails naming the file and the source, where the
pool's copy used to blame the target ("you cannot write in the stage target"), which the
user could write (issue 34). Run as a created user under root, else as the caller."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cotenant import User, ordinary_user, reachable_directory


@pytest.fixture
def user() -> Iterator[User]:
    with ordinary_user() as made:
        yield made


@pytest.mark.parametrize("how", [[], ["--copy"]], ids=["pool", "copy"])
def test_a_source_file_the_user_may_not_read_is_blamed_on_the_source(
        user: User, tmp_path: Path, other_fs: Path, how: list[str]) -> None:
    with reachable_directory(tmp_path) as base:
        home = user.home(base)
        tree = home / "tree"
        (tree / "rootfs").mkdir(parents=True)
        (tree / "rootfs" / "readable").write_text("fine\n")
        (tree / "rootfs" / "secret").write_text("nobody reads me\n")
        os.chmod(tree / "rootfs" / "secret", 0o000)
        target = other_fs / "target"
        target.mkdir()
        os.chown(target, user.uid, user.gid)
        for path in (tree, tree / "rootfs", tree / "rootfs" / "readable",
                     tree / "rootfs" / "secret"):
            os.chown(path, user.uid, user.gid, follow_symlinks=False)
        result = user.ocistage(base, "stage", str(tree), "--to", str(target), "--name", "x",
                               *how)
    assert result.returncode == 1, result.stderr
    assert f"cannot read {tree / 'rootfs' / 'secret'}: Permission denied" in result.stderr
    assert "hint: the source files must be readable by you" in result.stderr
    assert "stage target" not in result.stderr and "Traceback" not in result.stderr
    assert not os.path.lexists(target / "x")
