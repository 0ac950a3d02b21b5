"""ocistage.runtimes.userdb: Config.User resolution and reading the user database inside a rootfs
only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocistage.runtimes.errors import UserResolutionError
from ocistage.runtimes.userdb import (
    ResolvedUser,
    open_in_rootfs,
    read_group,
    read_passwd,
    resolve_user,
)

PASSWD = """\
root:x:0:0:root:/root:/bin/sh
# a comment line
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin

broken-line-without-fields
app:x:1000:1000:App User:/home/app:/bin/sh
other:x:1001:1001::/home/other:/bin/sh
nohome:x:1002:1002:::/bin/sh
+nisentry::::::
"""

GROUP = """\
root:x:0:
daemon:x:1:
app:x:1000:
other:x:1001:
video:x:44:app,other
audio:x:29:other
staff:x:50:app
apps-again:x:1000:app
bad:x:notanumber:app
"""


def make_rootfs(base: Path, passwd: str | None = PASSWD, group: str | None = GROUP) -> Path:
    rootfs = base / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    if passwd is not None:
        (rootfs / "etc" / "passwd").write_text(passwd)
    if group is not None:
        (rootfs / "etc" / "group").write_text(group)
    return rootfs


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    return make_rootfs(tmp_path)


@pytest.mark.parametrize(("user", "expected"), [
    (None, ResolvedUser(0, 0, (), "root", "/root")),
    ("", ResolvedUser(0, 0, (), "root", "/root")),
    ("root", ResolvedUser(0, 0, (), "root", "/root")),
    ("app", ResolvedUser(1000, 1000, (44, 50), "app", "/home/app")),
    ("other", ResolvedUser(1001, 1001, (44, 29), "other", "/home/other")),
    ("1000", ResolvedUser(1000, 1000, (), "app", "/home/app")),
    ("4242", ResolvedUser(4242, 0, (), None, "/")),
    ("app:video", ResolvedUser(1000, 44, (), "app", "/home/app")),
    ("app:44", ResolvedUser(1000, 44, (), "app", "/home/app")),
    ("1000:1001", ResolvedUser(1000, 1001, (), "app", "/home/app")),
    ("1000:staff", ResolvedUser(1000, 50, (), "app", "/home/app")),
    ("4242:4343", ResolvedUser(4242, 4343, (), None, "/")),
    ("4242:audio", ResolvedUser(4242, 29, (), None, "/")),
    (":video", ResolvedUser(0, 44, (), None, "/")),
    ("app:", ResolvedUser(1000, 1000, (44, 50), "app", "/home/app")),
    ("nohome", ResolvedUser(1002, 1002, (), "nohome", "/")),
])
def test_resolve_user_forms(rootfs: Path, user: str | None, expected: ResolvedUser) -> None:
    assert resolve_user(rootfs, user) == expected


@pytest.mark.parametrize(("user", "message"), [
    ("nobody", "unable to find user 'nobody'"),
    ("app:nogroup", "unable to find group 'nogroup'"),
    ("1000:nogroup", "unable to find group 'nogroup'"),
    ("99999999999", "out of range"),
    ("1:99999999999", "out of range"),
    ("+nisentry", "unable to find user"),
])
def test_unresolvable_users_are_typed_errors(rootfs: Path, user: str, message: str) -> None:
    with pytest.raises(UserResolutionError, match=message) as info:
        resolve_user(rootfs, user)
    assert info.value.hint


def test_missing_user_database(tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path, passwd=None, group=None)
    assert resolve_user(rootfs, "") == ResolvedUser(0, 0)
    assert resolve_user(rootfs, "1000:1000") == ResolvedUser(1000, 1000)
    with pytest.raises(UserResolutionError):
        resolve_user(rootfs, "app")
    with pytest.raises(UserResolutionError):
        resolve_user(rootfs, "0:wheel")


def test_missing_etc_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert resolve_user(tmp_path / "empty", "7") == ResolvedUser(7, 0)


def test_parsers_skip_malformed_lines(rootfs: Path) -> None:
    names = [entry.name for entry in read_passwd(rootfs)]
    assert names == ["root", "daemon", "app", "other", "nohome"]
    groups = {group.name: group.members for group in read_group(rootfs)}
    assert "bad" not in groups
    assert groups["video"] == ("app", "other")


def test_absolute_symlink_escaping_the_rootfs_resolves_inside(tmp_path: Path) -> None:
    outside = tmp_path / "host-etc"
    outside.mkdir()
    (outside / "passwd").write_text("evil:x:4242:4242::/:/bin/sh\n")
    rootfs = make_rootfs(tmp_path, passwd=None)
    # An image may legally carry this link; it must mean <rootfs>/<outside>/passwd.
    (rootfs / "etc" / "passwd").symlink_to("/../../../../" + str(outside / "passwd"))
    with pytest.raises(UserResolutionError, match="unable to find user 'evil'"):
        resolve_user(rootfs, "evil")
    # The same path recreated inside the rootfs is what the link names.
    inner = rootfs / str(outside).lstrip("/")
    inner.mkdir(parents=True)
    (inner / "passwd").write_text("good:x:77:78::/home/good:/bin/sh\n")
    assert resolve_user(rootfs, "good") == ResolvedUser(77, 78, (), "good", "/home/good")


def test_relative_symlink_escaping_the_rootfs_is_clamped(tmp_path: Path) -> None:
    (tmp_path / "passwd").write_text("evil:x:4242:4242::/:/bin/sh\n")
    rootfs = make_rootfs(tmp_path, passwd=None)
    (rootfs / "etc" / "passwd").symlink_to("../../passwd")  # would be tmp_path/passwd on the host
    with pytest.raises(UserResolutionError, match="unable to find user 'evil'"):
        resolve_user(rootfs, "evil")
    (rootfs / "passwd").write_text("inner:x:5:6::/:/bin/sh\n")  # ../../passwd from /etc = /passwd
    assert resolve_user(rootfs, "inner").uid == 5


def test_directory_symlink_escaping_the_rootfs(tmp_path: Path) -> None:
    host_etc = tmp_path / "host-etc"
    host_etc.mkdir()
    (host_etc / "passwd").write_text("evil:x:4242:4242::/:/bin/sh\n")
    (host_etc / "group").write_text("evilgroup:x:4242:app\n")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (rootfs / "etc").symlink_to(host_etc)  # absolute host path as an image symlink
    with pytest.raises(UserResolutionError):
        resolve_user(rootfs, "evil")
    with pytest.raises(UserResolutionError):
        resolve_user(rootfs, "0:evilgroup")


def test_symlinks_within_the_rootfs_are_followed(tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path, passwd=None, group=None)
    shared = rootfs / "usr" / "share" / "base"
    shared.mkdir(parents=True)
    (shared / "passwd").write_text(PASSWD)
    (shared / "group").write_text(GROUP)
    (rootfs / "etc" / "passwd").symlink_to("/usr/share/base/passwd")
    (rootfs / "etc" / "group").symlink_to("../usr/./share/base/../base/group")
    assert resolve_user(rootfs, "app") == ResolvedUser(1000, 1000, (44, 50), "app", "/home/app")


def test_symlink_loop_is_an_error(tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path, passwd=None)
    (rootfs / "etc" / "passwd").symlink_to("/../../etc/passwd")  # itself, after clamping
    with pytest.raises(UserResolutionError, match="symbolic links"):
        resolve_user(rootfs, "app")


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path, passwd=None)
    os.mkfifo(rootfs / "etc" / "passwd")
    with pytest.raises(UserResolutionError, match="not a regular file"):
        resolve_user(rootfs, "app")


def test_directory_as_passwd_is_an_error(tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path, passwd=None)
    (rootfs / "etc" / "passwd").mkdir()
    with pytest.raises(UserResolutionError):
        resolve_user(rootfs, "app")


def test_file_where_directory_expected_is_missing(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (rootfs / "etc").write_text("not a directory")
    assert open_in_rootfs(rootfs, "etc/passwd") is None
    assert resolve_user(rootfs, "12:34") == ResolvedUser(12, 34)


def test_overlong_lines_are_skipped_not_held(tmp_path: Path) -> None:
    huge = "x" * (1 << 20)
    rootfs = make_rootfs(tmp_path, passwd=f"{huge}:x:1:1::/:/bin/sh\napp:x:1000:1000::/h:/s\n")
    assert [entry.name for entry in read_passwd(rootfs)] == ["app"]


def test_non_utf8_names_are_compared_bytewise(tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path, passwd=None)
    (rootfs / "etc" / "passwd").write_bytes(b"caf\xe9:x:9:9::/:/bin/sh\n")
    assert resolve_user(rootfs, "9").uid == 9
    assert resolve_user(rootfs, "caf\udce9").uid == 9


def test_open_in_rootfs_reads_a_regular_file(rootfs: Path) -> None:
    file = open_in_rootfs(rootfs, "/./etc//passwd")
    assert file is not None
    with file:
        assert file.readline().startswith(b"root:")
    assert open_in_rootfs(rootfs, "etc/shadow") is None
