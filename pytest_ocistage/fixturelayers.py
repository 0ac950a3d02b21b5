"""Writes the hand-written tar layers of the fixture images, every header deterministic.

The ``busybox`` image's ``/home/app`` layer and the three layers of ``multilayer``, which
exercise every layer rule (pytest_ocistage/images.py)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MTIME = 1_700_000_000
LONG_NAME = "data/" + "long-directory-name-" * 4 + "/" + "a-file-with-a-name-well-beyond-100" * 2
XATTR_NAME, XATTR_VALUE = "user.ocistage.test", "xattr-value"
ESCAPING_LINK_TARGET = "/../../etc/shadow"



class LayerWriter:
    """Adds entries with deterministic headers to an open tar file."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar

    def _info(self, name: str, kind: bytes, mode: int, uid: int, gid: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode
        info.uid, info.gid = uid, gid
        info.uname = info.gname = ""
        info.mtime = MTIME
        return info

    def dir(self, name: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        self.tar.addfile(self._info(name, tarfile.DIRTYPE, mode, uid, gid))

    def file(self, name: str, data: bytes = b"", mode: int = 0o644, uid: int = 0, gid: int = 0,
             xattrs: dict[str, str] | None = None) -> None:
        info = self._info(name, tarfile.REGTYPE, mode, uid, gid)
        info.size = len(data)
        if xattrs:
            info.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in xattrs.items()}
        self.tar.addfile(info, io.BytesIO(data))

    def symlink(self, name: str, target: str) -> None:
        info = self._info(name, tarfile.SYMTYPE, 0o777, 0, 0)
        info.linkname = target
        self.tar.addfile(info)

    def hardlink(self, name: str, target: str) -> None:
        info = self._info(name, tarfile.LNKTYPE, 0o644, 0, 0)
        info.linkname = target
        self.tar.addfile(info)

    def fifo(self, name: str, mode: int = 0o644) -> None:
        self.tar.addfile(self._info(name, tarfile.FIFOTYPE, mode, 0, 0))


@contextmanager
def open_layer(path: Path) -> Iterator[LayerWriter]:
    """A new PAX-format tar layer at path."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        yield LayerWriter(tar)


def write_app_home_layer(path: Path) -> None:
    with open_layer(path) as layer:
        layer.dir("home/")
        layer.dir("home/app/", 0o755, 1000, 1000)
        layer.file("home/app/.profile", b"export PS1='app$ '\n", 0o644, 1000, 1000)
        layer.dir("tmp/", 0o1777)


def write_multilayer_lower(path: Path) -> None:
    """Layer 1: what the upper layers delete, replace and link to."""
    with open_layer(path) as layer:
        layer.dir("data/")
        layer.file("data/keep", b"kept\n")
        layer.file("data/whiteme", b"deleted by a whiteout\n")
        layer.dir("data/whitedir/")
        layer.file("data/whitedir/inner", b"deleted with its directory\n")
        layer.dir("data/opaque/")
        layer.file("data/opaque/a", b"hidden by an opaque whiteout\n")
        layer.file("data/opaque/b", b"hidden by an opaque whiteout\n")
        layer.dir("data/willbefile/")
        layer.file("data/willbefile/child", b"gone when the dir becomes a file\n")
        layer.file("data/willbelink", b"gone when the file becomes a symlink\n")
        layer.file("data/shared", b"shared content\n")
        layer.file("data/hl-a", b"hardlinked within one layer\n")
        layer.hardlink("data/hl-b", "data/hl-a")
        layer.dir("data/" + "long-directory-name-" * 4 + "/")
        layer.file(LONG_NAME, b"a PAX long name\n")
        layer.file("data/xattr", b"has a user xattr\n", xattrs={XATTR_NAME: XATTR_VALUE})
        layer.fifo("data/fifo")
        layer.file("data/setuid", b"#!/bin/sh\necho setuid\n", 0o4755)
        layer.file("data/setgid", b"#!/bin/sh\necho setgid\n", 0o2755)
        layer.file("data/mode000", b"unreadable by mode\n", 0o000)
        layer.dir("data/ro/", 0o555)
        layer.file("data/ro/file", b"in a read-only directory\n", 0o444)
        layer.symlink("data/escape", ESCAPING_LINK_TARGET)
        layer.symlink("data/relative-link", "keep")


def write_multilayer_upper(path: Path) -> None:
    """Layer 2: whiteouts, opaque dir (marker after a sibling), type changes, lower hardlink."""
    with open_layer(path) as layer:
        layer.file("data/.wh.whiteme")
        layer.file("data/.wh.whitedir")
        layer.file("data/opaque/c", b"survives the opaque whiteout of its own layer\n")
        layer.file("data/opaque/.wh..wh..opq")
        layer.file("data/willbefile", b"was a directory\n")
        layer.symlink("data/willbelink", "shared")
        layer.hardlink("data/hl-lower", "data/shared")
        layer.file("data/upper", b"from the upper layer\n")


def write_multilayer_top(path: Path) -> None:
    """Layer 3: a file added inside the lower layer's read-only directory."""
    with open_layer(path) as layer:
        layer.file("data/ro/added", b"added into a read-only directory\n")
