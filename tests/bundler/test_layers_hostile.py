"""Hostile layers: whatever they contain, nothing outside the rootfs may change.

Each case applies its layers to ``rootfs/`` inside a temporary directory that also holds a
canary tree beside it; symlinks in the layers point at the canary by relative and by absolute
host paths. The canary is snapshotted before and after: names, types, modes, contents, link
targets, mtimes and link counts must be identical (``/etc/passwd``: see :func:`passwd_state`).
The layer must either extract with everything inside the rootfs (checked per case) or fail
with a LayerError.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ocistage.bundler.unpack.apply import apply_layer
from ocistage.errors import LayerError
from tests.bundler.tarbuilder import (
    Entry,
    build_tar,
    chardev,
    directory,
    fifo,
    file,
    full_snapshot,
    hardlink,
    opaque,
    symlink,
    whiteout,
)


@dataclass
class Sandbox:
    base: Path
    rootfs: Path
    canary: Path

    @property
    def canary_abs(self) -> str:
        """The canary's absolute host path (as an absolute symlink target)."""
        return str(self.canary)

    @property
    def canary_in_root(self) -> Path:
        """Where the canary's absolute host path lands when resolved inside the rootfs."""
        return self.rootfs / self.canary.relative_to("/")


def make_sandbox(base: Path) -> Sandbox:
    rootfs = base / "rootfs"
    rootfs.mkdir()
    canary = base / "canary"
    (canary / "dir").mkdir(parents=True)
    (canary / "file").write_bytes(b"canary file")
    (canary / "dir" / "nested").write_bytes(b"nested")
    (canary / "ro").write_bytes(b"read only")
    (canary / "ro").chmod(0o444)
    os.symlink("file", canary / "link")
    for path in (canary / "dir" / "nested", canary / "file", canary / "dir", canary):
        os.utime(path, (1000, 1000), follow_symlinks=False)
    return Sandbox(base, rootfs, canary)


def passwd_state() -> object:
    """/etc/passwd as a layer could change it: its mode, owner and link count, and whether it
    is still a passwd file. Not its size or time: a concurrent ``useradd`` (another test, a
    co-tenant) rewrites it by rename, which a hostile layer cannot do (its writes would leave
    a payload of a few bytes, or a second link)."""
    passwd = Path("/etc/passwd")
    st = passwd.lstat()
    return (st.st_mode, st.st_uid, st.st_nlink, passwd.read_bytes().startswith(b"root:"))


def host_state(box: Sandbox) -> object:
    outside = sorted(p.name for p in box.base.iterdir())
    base = box.base.lstat()
    return (full_snapshot(box.canary), outside, (base.st_mode, base.st_uid), passwd_state())


def run_layers(box: Sandbox, layers: list[list[Entry]]) -> LayerError | None:
    """Apply the layers; return the LayerError if one was raised (anything else propagates)."""
    before = host_state(box)
    error: LayerError | None = None
    try:
        for entries in layers:
            apply_layer(io.BytesIO(build_tar(entries)), box.rootfs)
    except LayerError as exc:
        assert exc.message and exc.hint, "a LayerError needs a message and a hint"
        error = exc
    assert host_state(box) == before, "something outside the rootfs changed"
    return error


Check = Callable[[Sandbox], bool]


@dataclass
class Case:
    layers: Callable[[Sandbox], list[list[Entry]]]
    check: Check | None = None  # None: a LayerError is expected
    error: str = ""
    ids: list[str] = field(default_factory=list)


def read(path: Path) -> bytes:
    return path.read_bytes()


def read_deep(root: Path, parts: list[str]) -> bytes:
    """Read a file whose path is longer than PATH_MAX, one directory fd at a time."""
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        with os.fdopen(file_fd, "rb") as handle:
            return handle.read()
    finally:
        os.close(fd)


def is_link(path: Path, target: str) -> bool:
    return path.is_symlink() and os.readlink(path) == target


CASES: dict[str, Case] = {
    "dotdot-name": Case(
        lambda b: [[file("../x", b"1"), file("../../canary/file", b"2")]],
        lambda b: (read(b.rootfs / "x") == b"1" and read(b.rootfs / "canary/file") == b"2")),
    "absolute-name": Case(
        lambda b: [[file(str(b.canary / "file"), b"abs")]],
        lambda b: read(b.canary_in_root / "file") == b"abs"),
    "inner-dotdot": Case(
        lambda b: [[file("a/../../x", b"1"), directory("a/b/../../../../dir")]],
        lambda b: (b.rootfs / "x").is_file() and (b.rootfs / "dir").is_dir()),
    "symlink-to-dotdot-then-write": Case(
        lambda b: [[symlink("up", ".."), file("up/canary/file", b"x"),
                    file("up/up/up/escape", b"e"), directory("up/canary/dir", 0o000)]],
        lambda b: (read(b.rootfs / "canary/file") == b"x" and (b.rootfs / "escape").is_file()
                   and is_link(b.rootfs / "up", ".."))),
    "absolute-symlink-write-mkdir-chmod": Case(
        lambda b: [[symlink("c", b.canary_abs), file("c/file", b"pwned", 0o777),
                    file("c/new", b"n"), directory("c/dir", 0o000),
                    file("c/ro", b"w", 0o666), fifo("c/fifo"), chardev("c/dev")]],
        lambda b: (read(b.canary_in_root / "file") == b"pwned"
                   and (b.canary_in_root / "dir").is_dir()
                   and is_link(b.rootfs / "c", b.canary_abs))),
    "absolute-symlink-whiteouts": Case(
        lambda b: [[symlink("c", b.canary_abs), whiteout("c/file"), whiteout("c/dir"),
                    opaque("c"), whiteout("c/link")]],
        lambda b: is_link(b.rootfs / "c", b.canary_abs)),
    "absolute-symlink-whiteouts-lower": Case(
        lambda b: [[symlink("c", b.canary_abs)],
                   [whiteout("c/file"), opaque("c"), opaque("c/dir"), whiteout("c/dir/nested")]],
        lambda b: is_link(b.rootfs / "c", b.canary_abs)),
    "whiteout-of-symlink-to-outside-dir": Case(
        lambda b: [[symlink("c", b.canary_abs), symlink("r", "../canary")],
                   [whiteout("c"), whiteout("r")]],
        lambda b: not (b.rootfs / "c").is_symlink() and not (b.rootfs / "r").is_symlink()),
    "opaque-in-symlinked-dir": Case(
        lambda b: [[symlink("c", b.canary_abs), symlink("d", "../../canary/dir")],
                   [opaque("c"), opaque("d")]],
        lambda b: is_link(b.rootfs / "d", "../../canary/dir")),
    "hardlink-through-absolute-symlink": Case(
        lambda b: [[symlink("c", b.canary_abs), hardlink("h", "c/file")]],
        error="does not exist"),
    "hardlink-to-dotdot-outside": Case(
        lambda b: [[hardlink("h", "../canary/file")]], error="does not exist"),
    "hardlink-to-etc-passwd": Case(
        lambda b: [[hardlink("h", "/etc/passwd")]], error="does not exist"),
    "hardlink-into-symlinked-dir": Case(
        lambda b: [[file("f", b"f"), symlink("c", b.canary_abs), hardlink("c/h", "f"),
                    hardlink("c/file", "f")]],
        lambda b: (b.canary_in_root / "file").stat().st_ino == (b.rootfs / "f").stat().st_ino),
    "hardlink-to-symlink-to-outside": Case(
        lambda b: [[symlink("c", str(b.canary / "file")), hardlink("h", "c"), file("h", b"x")]],
        lambda b: read(b.rootfs / "h") == b"x" and is_link(b.rootfs / "c", str(b.canary / "file"))),
    "symlink-chains": Case(
        lambda b: [[symlink("a", "b"), symlink("b", "c/d"), symlink("c", "/"),
                    symlink("c/d", "../../../" + b.canary_abs), file("a/file", b"chain")]],
        lambda b: read(b.canary_in_root / "file") == b"chain"),
    "symlink-loop": Case(
        lambda b: [[symlink("l1", "l2"), symlink("l2", "l1"), file("l1/x", b"x")]],
        error="symbolic links"),
    "lower-symlink-used-in-upper": Case(
        lambda b: [[symlink("etc", b.canary_abs)], [file("etc/file", b"upper"),
                                                    directory("etc/dir", 0o777)],
                   [file("etc/dir/nested", b"3")]],
        lambda b: read(b.canary_in_root / "dir/nested") == b"3"),
    "file-replaces-symlink": Case(
        lambda b: [[symlink("c", str(b.canary / "file"))], [file("c", b"replaced", 0o777)]],
        lambda b: not (b.rootfs / "c").is_symlink() and read(b.rootfs / "c") == b"replaced"),
    "dir-over-symlink-to-outside": Case(
        lambda b: [[symlink("c", b.canary_abs)], [directory("c", 0o000), file("c/x", b"x")]],
        lambda b: (b.rootfs / "c").is_dir() and not (b.rootfs / "c").is_symlink()),
    "fifo-and-hardlink-replace-symlink": Case(
        lambda b: [[symlink("c", str(b.canary / "file")), symlink("d", str(b.canary / "ro")),
                    file("f", b"f")], [fifo("c", 0o777), hardlink("d", "f")]],
        lambda b: stat.S_ISFIFO((b.rootfs / "c").lstat().st_mode)),
    "pax-path-with-dotdot": Case(
        lambda b: [[file("../" * 60 + "canary/file", b"pax"),
                    symlink("s" * 120, "../" * 60 + "canary/file")]],
        lambda b: read(b.rootfs / "canary/file") == b"pax"),
    "device-node": Case(
        lambda b: [[chardev("dev/mem", 1, 1), chardev(str(b.canary / "dev"), 1, 3)]],
        lambda b: (b.rootfs / "dev/mem").stat().st_size == 0),
    "whiteout-dot-dot": Case(lambda b: [[file(".wh..")]], error="whiteout"),
    "whiteout-dot-dot-dot": Case(lambda b: [[file("a/.wh...")]], error="whiteout"),
    "whiteout-via-dotdot": Case(
        lambda b: [[file("keep", b"k")], [whiteout("../canary"), whiteout("a/../../../canary/file"),
                                          opaque("../..")]],
        lambda b: (b.rootfs / "keep").exists() is False),
    "very-long-component": Case(
        lambda b: [[file("x" * 300, b"x")]], error="File name too long"),
    "very-long-path": Case(
        lambda b: [[file("/".join(["p" * 200] * 30) + "/f", b"deep")]],
        lambda b: read_deep(b.rootfs, [*(["p" * 200] * 30), "f"]) == b"deep"),
    **{f"pax-mtime-{text}": Case(
        lambda b, text=text: [[directory("d", pax={"mtime": text}),
                               file("d/f", b"t", pax={"mtime": text}),
                               symlink("d/s", "f", pax={"mtime": text})]],
        lambda b: read(b.rootfs / "d/f") == b"t" and (b.rootfs / "d/s").is_symlink())
       for text in ("nan", "inf", "-inf", "1e30", "-1e30", "NaN", "1e999999")},
    "xattr-through-symlink": Case(
        lambda b: [[symlink("c", b.canary_abs), file("c/file", b"x", xattrs={"user.a": "b"})]],
        lambda b: os.getxattr(b.canary_in_root / "file", "user.a") == b"b"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_layer(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    box = make_sandbox(tmp_path)
    error = run_layers(box, case.layers(box))
    if case.check is None:
        assert error is not None, "a LayerError was expected"
        assert case.error in error.message
    else:
        assert error is None, f"unexpected LayerError: {error}"
        assert case.check(box), "the layer did not extract where it should"


# -- random hostile sequences -------------------------------------------------------------------

NAMES = st.sampled_from(["c", "d", "x", "c/x", "c/file", "c/dir", "c/dir/nested", "d/x",
                         "../x", "../canary/file", "up/canary/file", "a/b", "a", "c/..",
                         "CANARY/file", "CANARY/dir/x", "up", "c/link", "c/ro"])
TARGETS = st.sampled_from(["..", "/", "../..", "CANARY", "CANARY/file", "CANARY/dir",
                           "c", "d", "a/b", "../canary", "up/canary", "x", "/etc/passwd",
                           "c/file", "loop", "CANARY/link"])
OPS = st.sampled_from(["file", "dir", "symlink", "hardlink", "whiteout", "opaque", "fifo",
                       "dev"])


def entry_for(op: str, name: str, target: str, canary: str) -> Entry:
    name = name.replace("CANARY", canary)
    target = target.replace("CANARY", canary)
    builders: dict[str, Callable[[], Entry]] = {
        "file": lambda: file(name, b"hostile", 0o777),
        "dir": lambda: directory(name, 0o000),
        "symlink": lambda: symlink(name, target),
        "hardlink": lambda: hardlink(name, target),
        "whiteout": lambda: whiteout(name),
        "opaque": lambda: opaque(name),
        "fifo": lambda: fifo(name),
        "dev": lambda: chardev(name),
    }
    return builders[op]()


LAYERS = st.lists(st.lists(st.tuples(OPS, NAMES, TARGETS), min_size=1, max_size=8),
                  min_size=1, max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LAYERS)
def test_random_hostile_sequences_never_touch_the_canary(
        layers: list[list[tuple[str, str, str]]]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        box = make_sandbox(Path(scratch))
        canary = box.canary_abs
        built = [[symlink("c", canary), symlink("up", "..")]]
        built += [[entry_for(op, name, target, canary) for op, name, target in layer]
                  for layer in layers]
        run_layers(box, built)
        for dirpath, dirnames, _ in os.walk(box.rootfs):  # the bundle stays deletable
            for dirname in dirnames:
                full = Path(dirpath) / dirname
                if not full.is_symlink():
                    assert full.lstat().st_mode & 0o700 == 0o700
