from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ocistage.stagers.copy import Copier, link_fd


def _source(tmp_path: Path, size: int) -> Path:
    src = tmp_path / "src"
    src.write_bytes(os.urandom(size))
    return src


@pytest.mark.parametrize("size", [0, 1, 70_000, 3 << 20])
def test_copy_new_keeps_content_mode_and_mtime(tmp_path: Path, size: int) -> None:
    src = _source(tmp_path, size)
    dst = tmp_path / "dst"
    method = Copier().copy_new(str(src), str(dst), 0o751, mtime_ns=1_600_000_000_123_456_789)
    assert dst.read_bytes() == src.read_bytes()
    st = dst.stat()
    assert stat.S_IMODE(st.st_mode) == 0o751
    assert st.st_mtime_ns == 1_600_000_000_123_456_789
    assert st.st_ino != src.stat().st_ino
    assert method in ("reflink", "copy_file_range", "sendfile", "read-write")


def test_copier_falls_back_and_remembers(tmp_path: Path, other_fs: Path) -> None:
    src = _source(tmp_path, 100_000)
    copier = Copier()
    first = copier.copy_new(str(src), str(other_fs / "a"), 0o644)
    second = copier.copy_new(str(src), str(other_fs / "b"), 0o644)
    assert first == second  # the same way once the unsupported ones are known
    assert (other_fs / "b").read_bytes() == src.read_bytes()
    forced = Copier(reflink=False, copy_file_range=False, sendfile=False)
    assert forced.copy_new(str(src), str(other_fs / "c"), 0o600) == "read-write"
    assert (other_fs / "c").read_bytes() == src.read_bytes()


def test_copy_never_follows_symlinks(tmp_path: Path) -> None:
    src = _source(tmp_path, 10)
    os.symlink(src, tmp_path / "link")
    with pytest.raises(OSError):
        Copier().copy_new(str(tmp_path / "link"), str(tmp_path / "x"), 0o644)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, tmp_path / "dst-link")
    with pytest.raises(OSError):
        Copier().copy_new(str(src), str(tmp_path / "dst-link"), 0o644)
    assert victim.read_text() == "keep"


def test_link_fd_names_a_nameless_file(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_TMPFILE | os.O_WRONLY, 0o600)
    try:
        os.write(fd, b"tmpfile")
        link_fd(fd, str(tmp_path / "named"))
        with pytest.raises(FileExistsError):
            link_fd(fd, str(tmp_path / "named"))
    finally:
        os.close(fd)
    assert (tmp_path / "named").read_bytes() == b"tmpfile"
