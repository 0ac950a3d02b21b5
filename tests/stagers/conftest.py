"""Shared helpers for the stagers tests: small trees and a second filesystem."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_ocistage.components import require_binary, require_root, running_as_root

#: the mode of the tree's ``secret``, a file no one but its owner may read. Root's tests make it
#: 000 (root reads it anyway); a user cannot read a 000 file of its own, and ocistage refuses a
#: source its caller cannot read ("the source files must be readable by you"), so for a user it
#: is 0400: still unreadable to everyone else, and staged with that mode
SECRET_MODE = 0o000 if running_as_root() else 0o400

CONFIG = b'{"ociVersion": "1.0.2", "root": {"path": "rootfs", "readonly": false}}\n'


def make_tree(root: Path, files: int = 40, seed: int = 0) -> Path:
    """A bundle-shaped tree: config.json, rootfs with dirs, files, symlinks, a hardlink, a
    fifo, a read-only directory and a file only its owner may read (:data:`SECRET_MODE`)."""
    rootfs = root / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    (root / "config.json").write_bytes(CONFIG)
    for n in range(files):
        (rootfs / "bin" / f"f{n}").write_bytes(f"file {n} seed {seed}\n".encode() * (n + 1))
    (rootfs / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    os.symlink("/etc/shadow", rootfs / "etc" / "escape")  # data, kept verbatim
    os.symlink("../bin/f0", rootfs / "etc" / "rel")
    os.link(rootfs / "bin" / "f1", rootfs / "etc" / "hardlink")
    os.mkfifo(rootfs / "etc" / "fifo")
    (rootfs / "secret").write_text("nobody may read me\n")
    (rootfs / "secret").chmod(SECRET_MODE)
    (rootfs / "ro").mkdir()
    (rootfs / "ro" / "inside").write_text("x\n")
    (rootfs / "ro").chmod(0o555)
    return root


def require_fuse_mount(*tools: str) -> None:
    """What a squashfuse mount needs, or skip: squashfuse, mksquashfs and ``tools`` (Debian
    packages: skip, or fail under OCISTAGE_REQUIRE_E2E=1), and for a user fusermount and a
    ``/dev/fuse`` it may open. Where that device is root's alone (0600, as on some build
    hosts; Debian makes it 0666), only root can mount: the test needs root there."""
    for tool in ("squashfuse", "mksquashfs", *tools):
        require_binary(tool)
    if running_as_root():
        return
    require_binary("fusermount3")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        require_root()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "bundle")


@pytest.fixture
def sealed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every source counts as sealed (a bundle in the cache, whose files nobody writes), so
    a tree of the test's on the target's filesystem is staged by ``hardlink``; its identity
    is new at each stage, so a re-stage still walks the tree (and sees the test's changes)."""
    from ocistage.stagers import directory as stage

    monkeypatch.setattr(stage, "source_identity",
                        lambda source, cache_root: f"sealed-for-the-test:{uuid.uuid4()}")


@pytest.fixture
def other_fs() -> Iterator[Path]:
    """A directory on another filesystem than tmp_path (tmpfs /dev/shm), or skip."""
    base = Path("/dev/shm")
    if not base.is_dir() or not os.access(base, os.W_OK):
        pytest.skip("/dev/shm is not a writable tmpfs here")
    path = base / f"ocistage-test-{uuid.uuid4().hex[:10]}"
    path.mkdir()
    yield path
    from ocistage.cache.treeremoval import remove_tree

    remove_tree(path)


@pytest.fixture
def one_pass(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Re-stages through the pool take the one-pass way (:mod:`ocistage.stagers.restage`)
    even for a small tree: the stat walk is split into two processes from one subtree up
    (a forked worker and the stager), the top expanded only until there are two. Returns a
    list that records, per changed re-stage, whether that way placed it."""
    from ocistage.stagers import directory, statwalk

    monkeypatch.setattr(statwalk, "MIN_PARALLEL_DIRS", 1)
    monkeypatch.setattr(statwalk, "SUBTREES_PER_PROCESS", 1)
    monkeypatch.setattr(directory, "usable_cpus", lambda: 2)
    used: list[bool] = []
    real = directory.restage_through_pool

    def spy(*args: Any, **kwargs: Any) -> Any:
        done = real(*args, **kwargs)
        used.append(done is not None)
        return done

    monkeypatch.setattr(directory, "restage_through_pool", spy)
    return used
