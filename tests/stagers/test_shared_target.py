"""One sticky target shared by every user (issue 39: ``/scratch/bundles``, mode 1777): real
users (``nobody`` through ``setpriv``, a user made with ``useradd``, and root) stage into it
one after another and at once, each with a scratch dir and a pool of their own
(``.ocistage-tmp-<uid>``, ``.ocistage-pool-<uid>``; the scratch dir goes when the staging
ends), and none of them can be kept out, or fooled, by what another made there first."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache.errors import UntrustedPath
from ocistage.cache.locks import FileLock
from ocistage.cache.targetlayout import tmp_name
from ocistage.stagers.target import in_checked_dir, own_dir, take_name_lock
from tests.cotenant import (
    NOBODY,
    NOBODY_USER,
    ROOT,
    User,
    as_nobody,
    created_user,
    second_user,
    sticky_directory,
)
from tests.removers import settle_homes

pytestmark = second_user

FILES = 200


@pytest.fixture
def shared() -> Iterator[Path]:
    """The shared target: a sticky, world-writable directory in a root-owned 0755 one, which
    also holds the users' homes (``../homes``) and the source tree (``../src``)."""
    with sticky_directory("ocistage-shared-") as directory:
        homes = directory.parent / "homes"
        homes.mkdir()
        try:
            yield directory
        finally:
            settle_homes(homes)  # the removers of replaced versions, before the rmtree


@pytest.fixture
def user() -> Iterator[User]:
    with created_user() as made:
        yield made


def homes(shared: Path) -> Path:
    return shared.parent / "homes"


def source(shared: Path, version: str) -> Path:
    """A bundle tree every user can read (not sealed: staged through the target's pool)."""
    tree = shared.parent / "src"
    (tree / "rootfs" / "etc").mkdir(parents=True, exist_ok=True)
    (tree / "config.json").write_text('{"root": {"path": "rootfs"}}\n')
    for n in range(FILES):
        (tree / "rootfs" / f"f{n}").write_text(f"file {n}\n")
    (tree / "rootfs" / "etc" / "version").write_text(version)
    for path in (tree, *tree.rglob("*")):
        path.chmod(path.stat().st_mode | 0o755 if path.is_dir() else 0o644)
    return tree


def stage(who: User, shared: Path, name: str) -> dict[str, object]:
    result = who.ocistage(homes(shared), "stage", str(source_of(shared)), "--to", str(shared),
                          "--name", name, "--json")
    assert result.returncode == 0, f"{who.name}: {result.stderr}"
    staged: dict[str, object] = json.loads(result.stdout)
    return staged


def source_of(shared: Path) -> Path:
    return shared.parent / "src"


def assert_staged(shared: Path, who: User, name: str, version: str) -> None:
    path = shared / name
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == who.uid, name
    assert (path / "rootfs" / "etc" / "version").read_text() == version
    assert len(os.listdir(path / "rootfs")) == FILES + 1


def own_entries(shared: Path, users: list[User], names: list[str]) -> list[str]:
    """What a target holds once ``users`` staged ``names`` and every staging has ended:
    those and each user's pool, no scratch dir."""
    return sorted([*names, *(f".ocistage-pool-{who.uid}" for who in users)])


def test_every_user_stages_into_one_sticky_target_one_after_another(
        shared: Path, user: User) -> None:
    users = [NOBODY_USER, user, ROOT]
    for version in ("one\n", "two\n"):  # the second round replaces each user's version
        source(shared, version)
        for who in users:
            staged = stage(who, shared, f"app-{who.name}")
            assert staged["method"] == "pool" and staged["path"] == str(shared / f"app-{who.name}")
            assert_staged(shared, who, f"app-{who.name}", version)
            assert not [n for n in os.listdir(shared) if n.startswith(".ocistage-tmp")]
    names = [f"app-{who.name}" for who in users]
    settle_homes(homes(shared))  # the replaced versions are removed by detached removers
    assert sorted(os.listdir(shared)) == own_entries(shared, users, names)
    for who in users:
        pool = shared / f".ocistage-pool-{who.uid}"
        assert os.lstat(pool).st_uid == who.uid and stat.S_IMODE(os.lstat(pool).st_mode) == 0o700
    # nobody's version is not another user's to replace, and the other way round
    for who, theirs in ((NOBODY_USER, "app-root"), (ROOT, "app-nobody"), (user, "app-nobody")):
        refused = who.ocistage(homes(shared), "stage", str(source_of(shared)), "--to",
                               str(shared), "--name", theirs)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert refused.stderr.startswith("error: ")
    for who in users:
        assert_staged(shared, who, f"app-{who.name}", "two\n")
    # each unstages their own; their pool entries go with it
    for who in users:
        gone = who.ocistage(homes(shared), "unstage", str(shared / f"app-{who.name}"))
        assert gone.returncode == 0, gone.stderr
    settle_homes(homes(shared))
    assert sorted(os.listdir(shared)) == own_entries(shared, users, [])
    assert [p for p in shared.rglob("*") if p.is_file()] == []


def test_users_stage_into_one_sticky_target_at_once(shared: Path, user: User) -> None:
    users = [NOBODY_USER, user, ROOT]
    source(shared, "one\n")
    names = {who.name: [f"{who.name}-{n}" for n in range(3)] for who in users}
    started = [(who, names[who.name][n],
                who.start(homes(shared), "stage", str(source_of(shared)), "--to", str(shared),
                          "--name", names[who.name][n]))
               for n in range(3) for who in users]  # the users' stagings interleaved
    for who, name, process in started:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, f"{who.name} staging {name}: {err}"
    for who in users:
        for name in names[who.name]:
            assert_staged(shared, who, name, "one\n")
    assert sorted(os.listdir(shared)) == own_entries(
        shared, users, [name for who in users for name in names[who.name]])


SQUATS = {
    "directory": ["mkdir", "-m", "0777"],
    "fifo": ["mkfifo", "-m", "0666"],
    "file": ["touch"],
    "symlink": ["ln", "-s", "/"],
}


@pytest.mark.parametrize("kind", sorted(SQUATS))
@pytest.mark.parametrize("entry", [".ocistage-tmp", ".ocistage-pool"])
def test_a_name_a_cotenant_made_first_is_a_clean_error(shared: Path, user: User, entry: str,
                                                       kind: str) -> None:
    """``nobody`` makes the user's scratch dir or pool name first, as anything: the user's
    staging stops with one error naming it, its owner and what to do, never waits on a
    FIFO or follows a link, and leaves the entry as it was (and nothing of the user's)."""
    squatted = shared / f"{entry}-{user.uid}"
    as_nobody(*SQUATS[kind], str(squatted))
    before = os.lstat(squatted)
    source(shared, "one\n")
    result = user.ocistage(homes(shared), "stage", str(source_of(shared)), "--to", str(shared),
                           "--name", "app", timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    error, hint = result.stderr.splitlines()[:2]
    assert error.startswith("error: refusing ") and f"{squatted}: it " in error
    if kind == "directory":
        assert "owned by nobody (uid 65534)" in error
    assert hint.startswith("hint: another user made that name first")
    after = os.lstat(squatted)
    assert (after.st_ino, after.st_mode, after.st_uid) == (before.st_ino, before.st_mode,
                                                           before.st_uid)
    assert sorted(os.listdir(shared)) == [squatted.name]


def test_the_plain_names_a_cotenant_made_are_not_in_the_way(shared: Path, user: User) -> None:
    """``.ocistage-tmp`` and ``.ocistage-pool`` of another user (what an earlier release
    made in a shared target, or a co-tenant planted) are neither used nor touched."""
    for name in (".ocistage-tmp", ".ocistage-pool"):
        as_nobody("mkdir", "-m", "0777", str(shared / name))
        as_nobody("touch", str(shared / name / "theirs"))
    source(shared, "one\n")
    for who in (user, ROOT):
        stage(who, shared, f"app-{who.name}")
        assert_staged(shared, who, f"app-{who.name}", "one\n")
    for name in (".ocistage-tmp", ".ocistage-pool"):
        assert os.listdir(shared / name) == ["theirs"]
    assert sorted(os.listdir(shared)) == sorted([
        ".ocistage-pool", ".ocistage-tmp", *own_entries(shared, [user, ROOT],
                                                        ["app-root", f"app-{user.name}"])])


def test_a_scratch_dir_in_use_is_not_removed(shared: Path, user: User) -> None:
    """A staging that ends leaves the user's scratch dir while another of theirs works in it
    (a lock of theirs is there), and the last one removes it."""
    scratch = shared / f".ocistage-tmp-{user.uid}"
    source(shared, "one\n")
    subprocess.run(user.argv("mkdir", "-m", "0700", str(scratch)), check=True)
    subprocess.run(user.argv("touch", str(scratch / "other.lock")), check=True)
    stage(user, shared, "app")
    assert os.listdir(scratch) == ["other.lock"]
    (scratch / "other.lock").unlink()
    stage(user, shared, "again")
    assert not os.path.lexists(scratch)


def test_a_lock_taken_in_a_scratch_dir_replaced_since_it_was_checked_is_not_trusted(
        shared: Path) -> None:
    """The race :func:`take_name_lock` closes: a waiting stager checked the scratch dir, its
    last stager then removed it (empty), and a co-tenant's directory took the name before
    the waiting one's next try made its lock file, by path, in there. That lock is not in
    the directory that was checked: it is dropped, and the name is looked up again (and
    refused, naming the co-tenant)."""
    name = tmp_name(True)
    checked = own_dir(shared, name, "staging scratch directory")
    try:
        as_nobody("mkdir", "-m", "0777", str(shared / ".theirs"))
        os.rmdir(shared / name)
        os.rename(shared / ".theirs", shared / name)  # at once (root may move theirs)
        lock = FileLock(shared / name / "app.lock")
        lock.acquire(timeout=0)
        try:
            assert not in_checked_dir(checked, "app.lock", shared / name)
        finally:
            lock.release()
    finally:
        os.close(checked)
    assert os.listdir(shared / name) == []
    with pytest.raises(UntrustedPath, match=f"{shared / name}: it is owned by nobody"):
        take_name_lock(shared, "app", timeout=5)
    assert os.listdir(shared / name) == [] and os.lstat(shared / name).st_uid == NOBODY
