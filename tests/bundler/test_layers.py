from __future__ import annotations

import io
import itertools
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from ocistage.bundler.unpack.apply import ApplyReport, apply_layer
from ocistage.bundler.unpack.decompress import open_layer_stream
from ocistage.cache.notice import Kind
from ocistage.errors import LayerError
from pytest_ocistage.components import require_binary, require_root, running_as_root
from tests.bundler.tarbuilder import (
    MTIME,
    Entry,
    blockdev,
    build_tar,
    chardev,
    directory,
    fifo,
    file,
    hardlink,
    opaque,
    snapshot,
    symlink,
    whiteout,
    write_oci_layout,
)
from tests.owned import read_own_bytes


def apply(rootfs: Path, entries: list[Entry], **kw: bool) -> ApplyReport:
    return apply_layer(io.BytesIO(build_tar(entries)), rootfs, **kw)


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    path = tmp_path / "rootfs"
    path.mkdir()
    return path


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# -- entries -----------------------------------------------------------------------------------


def test_files_dirs_symlinks_fifos_with_modes_and_times(rootfs: Path) -> None:
    report = apply(rootfs, [
        directory("usr", 0o755, mtime=111),
        directory("usr/bin", 0o755, mtime=222),
        file("usr/bin/su", b"suid", 0o4755, mtime=333),
        file("usr/bin/wall", b"sgid", 0o2755),
        directory("tmp", 0o1777),
        file("etc/secret", b"s", 0o000),
        symlink("usr/bin/sh", "/../../bin/dash", mtime=444),
        fifo("run/fifo", 0o640),
    ])
    assert report.entries == 8
    assert report.bytes_written == 9
    assert report.warnings == []
    assert (rootfs / "usr/bin/su").read_bytes() == b"suid"
    assert mode_of(rootfs / "usr/bin/su") == 0o4755
    assert mode_of(rootfs / "usr/bin/wall") == 0o2755
    assert mode_of(rootfs / "tmp") == 0o1777
    assert mode_of(rootfs / "etc/secret") == 0o000
    assert os.readlink(rootfs / "usr/bin/sh") == "/../../bin/dash"
    assert stat.S_ISFIFO((rootfs / "run/fifo").lstat().st_mode)
    assert mode_of(rootfs / "run/fifo") == 0o640
    assert (rootfs / "usr").stat().st_mtime == 111  # set after its children were written
    assert (rootfs / "usr/bin").stat().st_mtime == 222
    assert (rootfs / "usr/bin/su").stat().st_mtime == 333
    assert (rootfs / "usr/bin/sh").lstat().st_mtime == 444
    assert (rootfs / "usr/bin/wall").stat().st_mtime == MTIME


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000, 0o027])
def test_file_modes_do_not_depend_on_the_umask(rootfs: Path, umask: int) -> None:
    modes = [0o644, 0o755, 0o666, 0o777, 0o600, 0o444, 0o000, 0o4755, 0o2711, 0o1644]
    old = os.umask(umask)
    try:
        apply(rootfs, [file(f"f{mode:04o}", b"data", mode) for mode in modes])
    finally:
        os.umask(old)
    assert {mode: mode_of(rootfs / f"f{mode:04o}") for mode in modes} == \
        {mode: mode for mode in modes}
    assert all(read_own_bytes(rootfs / f"f{mode:04o}") == b"data" for mode in modes)


def test_big_file_is_streamed_intact(rootfs: Path) -> None:
    data = os.urandom(3 << 20) + b"tail"
    report = apply(rootfs, [file("big", data)])
    assert (rootfs / "big").read_bytes() == data
    assert report.bytes_written == len(data)


def test_pax_long_names_linknames_and_mtime(rootfs: Path) -> None:
    deep = "/".join(["d" * 60] * 6)
    long_target = "/" + "t" * 300
    apply(rootfs, [
        file(f"{deep}/{'f' * 200}", b"long"),
        symlink(f"{deep}/link", long_target),
        hardlink(f"{deep}/hard", f"{deep}/{'f' * 200}"),
        file("frac", b"", mtime=1234.5),
    ])
    assert (rootfs / deep / ("f" * 200)).read_bytes() == b"long"
    assert os.readlink(rootfs / deep / "link") == long_target
    assert (rootfs / deep / "hard").stat().st_ino == (rootfs / deep / ("f" * 200)).stat().st_ino
    assert (rootfs / "frac").stat().st_mtime_ns == 1234_500_000_000


def test_gnu_long_names(rootfs: Path) -> None:
    name = "g" * 150 + "/" + "h" * 150
    tar = build_tar([file(name, b"gnu"), symlink("l", "x" * 200)], fmt=tarfile.GNU_FORMAT)
    apply_layer(io.BytesIO(tar), rootfs)
    assert (rootfs / name).read_bytes() == b"gnu"
    assert os.readlink(rootfs / "l") == "x" * 200


def test_user_xattrs_set_unsupported_namespaces_warned(rootfs: Path) -> None:
    report = apply(rootfs, [
        directory("d", xattrs={"user.dir": "D"}),
        file("d/f", b"x", xattrs={"user.one": "1", "system.bogus": "no"}),
        symlink("d/l", "f", xattrs={"user.link": "L"}),
    ])
    assert os.getxattr(rootfs / "d/f", "user.one") == b"1"
    assert os.getxattr(rootfs / "d", "user.dir") == b"D"
    assert any("system.bogus" in w.text for w in report.warnings)
    assert any("symlink" in w.text for w in report.warnings)
    assert {w.kind for w in report.warnings} == {Kind.XATTR}


def test_rootless_devices_become_empty_files(rootfs: Path) -> None:
    report = apply(rootfs, [chardev("dev/null", 1, 3, 0o666), blockdev("dev/sda", 8, 0, 0o660)])
    for name, mode in (("dev/null", 0o666), ("dev/sda", 0o660)):
        info = (rootfs / name).lstat()
        assert stat.S_ISREG(info.st_mode) and info.st_size == 0
        assert stat.S_IMODE(info.st_mode) == mode
    assert len(report.warnings) == 2
    assert "1:3" in report.warnings[0].text and "character" in report.warnings[0].text
    assert {w.kind for w in report.warnings} == {Kind.DEVICE_NODE}


@pytest.mark.needs_root("creating device nodes and chown need root")
def test_privileged_mode_makes_devices_and_owners(rootfs: Path) -> None:
    apply(rootfs, [
        chardev("dev/null", 1, 3, 0o666),
        Entry("owned", data=b"o", mode=0o4750, uid=1234, gid=99),
        Entry("dir", tarfile.DIRTYPE, mode=0o500, uid=7, gid=8),
        Entry("link", tarfile.SYMTYPE, linkname="owned", uid=5, gid=6),
    ], rootless=False)
    info = (rootfs / "dev/null").lstat()
    assert stat.S_ISCHR(info.st_mode) and os.major(info.st_rdev) == 1
    owned = (rootfs / "owned").lstat()
    assert (owned.st_uid, owned.st_gid, stat.S_IMODE(owned.st_mode)) == (1234, 99, 0o4750)
    assert mode_of(rootfs / "dir") == 0o500  # exact when not rootless
    assert (rootfs / "dir").lstat().st_uid == 7
    assert (rootfs / "link").lstat().st_uid == 5


def test_rootless_directories_keep_owner_rwx(rootfs: Path) -> None:
    apply(rootfs, [directory("locked", 0o000), file("locked/f", b"x", 0o000),
                   directory("ro", 0o555), directory("wx", 0o300), directory("sticky", 0o1755)])
    assert mode_of(rootfs / "locked") == 0o700
    assert mode_of(rootfs / "locked/f") == 0o000
    assert mode_of(rootfs / "ro") == 0o755
    assert mode_of(rootfs / "wx") == 0o700
    assert mode_of(rootfs / "sticky") == 0o1755


UNPRIVILEGED_SCRIPT = """
import io, os, shutil, sys
from pathlib import Path
from ocistage.bundler.unpack.apply import apply_layer
root = Path(sys.argv[1]) / "rootfs"
root.mkdir()
for layer in sys.argv[2:]:
    apply_layer(open(layer, "rb"), root)
print(oct(os.stat(root / "locked").st_mode & 0o7777), oct(os.stat(root / "su").st_mode & 0o7777))
shutil.rmtree(root)  # an unprivileged user can always delete the bundle
print("deleted")
"""


def test_rootless_as_an_unprivileged_user() -> None:
    """Run by root, as nobody (setpriv); run by a user, as that user."""
    layers = [[directory("locked", 0o000), file("locked/f", b"x", 0o000), directory("ro", 0o555),
               file("ro/g", b"g", 0o444), chardev("dev/null")],
              [file("locked/new", b"n"), whiteout("locked/f"), opaque("ro"), file("ro/h", b"h"),
               file("su", b"s", 0o4755)]]
    repo = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        work.chmod(0o755)
        paths = []
        for index, entries in enumerate(layers):
            paths.append(work / f"layer{index}.tar")
            paths[-1].write_bytes(build_tar(entries))
        as_user: list[str] = []
        if running_as_root():
            os.chown(work, 65534, 65534)
            for parent in [*work.parents, repo, *repo.parents]:
                if parent.stat().st_mode & 0o001 == 0:
                    pytest.skip(f"{parent} is not searchable by other users")
            as_user = [require_binary("setpriv"), "--reuid", "65534", "--regid", "65534",
                       "--clear-groups"]
        result = subprocess.run(
            [*as_user, sys.executable, "-c", UNPRIVILEGED_SCRIPT, str(work), *map(str, paths)],
            capture_output=True, text=True, cwd=work, env={"PYTHONPATH": str(repo)},
            timeout=60)
    if as_user and ("ModuleNotFoundError" in result.stderr or "can't open file" in result.stderr):
        pytest.skip(f"python cannot run as an unprivileged user here: {result.stderr[-200:]}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0o700", "0o4755", "deleted"]


def test_root_entry_sets_rootfs_metadata(rootfs: Path) -> None:
    apply(rootfs, [directory("./", 0o750, mtime=42), file("./x", b"x")])
    assert mode_of(rootfs) == 0o750
    assert rootfs.stat().st_mtime == 42


# -- type changes --------------------------------------------------------------------------------


def test_type_changes_replace_existing_entries(rootfs: Path) -> None:
    apply(rootfs, [directory("a"), file("a/child", b"c"), file("b", b"b"), file("c", b"c"),
                   directory("d"), symlink("e", "target"), file("target", b"t")])
    apply(rootfs, [
        file("a", b"now a file"),         # dir -> file removes the tree
        directory("b"),                   # file -> dir
        symlink("c", "/elsewhere"),       # file -> symlink
        symlink("d", "target"),           # dir -> symlink
        file("e", b"replaced link"),      # symlink -> file replaces the link itself
    ])
    assert (rootfs / "a").read_bytes() == b"now a file"
    assert (rootfs / "b").is_dir() and not (rootfs / "b").is_symlink()
    assert os.readlink(rootfs / "c") == "/elsewhere"
    assert os.readlink(rootfs / "d") == "target"
    assert not (rootfs / "e").is_symlink() and (rootfs / "e").read_bytes() == b"replaced link"
    assert (rootfs / "target").read_bytes() == b"t"


def test_directory_over_directory_keeps_children_and_updates_metadata(rootfs: Path) -> None:
    apply(rootfs, [directory("d", 0o755, mtime=1), file("d/old", b"o")])
    apply(rootfs, [directory("d", 0o710, mtime=2), file("d/new", b"n")])
    assert listing(rootfs / "d") == ["new", "old"]
    assert mode_of(rootfs / "d") == 0o710
    assert (rootfs / "d").stat().st_mtime == 2


def test_duplicate_entry_in_one_layer_last_wins(rootfs: Path) -> None:
    apply(rootfs, [file("f", b"first"), file("f", b"second", 0o600)])
    assert (rootfs / "f").read_bytes() == b"second"
    assert mode_of(rootfs / "f") == 0o600


# -- hardlinks -----------------------------------------------------------------------------------


def test_hardlinks_same_and_lower_layer(rootfs: Path) -> None:
    apply(rootfs, [file("lower", b"L", 0o640)])
    apply(rootfs, [file("same", b"S"), hardlink("h1", "same"), hardlink("dir/h2", "/lower"),
                   hardlink("h3", "./dir/../lower")])
    assert (rootfs / "h1").stat().st_ino == (rootfs / "same").stat().st_ino
    assert (rootfs / "dir/h2").stat().st_ino == (rootfs / "lower").stat().st_ino
    assert (rootfs / "h3").stat().st_ino == (rootfs / "lower").stat().st_ino
    assert (rootfs / "lower").stat().st_nlink == 3


def test_hardlink_replaces_existing_entry(rootfs: Path) -> None:
    apply(rootfs, [file("src", b"s"), directory("dst"), file("dst/x", b"x")])
    apply(rootfs, [hardlink("dst", "src")])
    assert (rootfs / "dst").stat().st_ino == (rootfs / "src").stat().st_ino


def test_hardlink_to_symlink_links_the_symlink(rootfs: Path) -> None:
    apply(rootfs, [file("real", b"r"), symlink("sym", "real"), hardlink("hl", "sym")])
    assert os.readlink(rootfs / "hl") == "real"
    assert (rootfs / "hl").lstat().st_ino == (rootfs / "sym").lstat().st_ino


@pytest.mark.parametrize("target", ["missing", "dir/missing", "", "/"])
def test_hardlink_to_missing_target_is_an_error(rootfs: Path, target: str) -> None:
    with pytest.raises(LayerError, match="does not exist"):
        apply(rootfs, [hardlink("h", target)])


def test_hardlink_to_directory_is_an_error(rootfs: Path) -> None:
    with pytest.raises(LayerError, match="directory"):
        apply(rootfs, [directory("d"), hardlink("h", "d")])


def test_hardlink_replacing_the_directory_of_its_target_is_an_error(rootfs: Path) -> None:
    with pytest.raises(LayerError, match="its own target"):
        apply(rootfs, [directory("d"), file("d/f", b"x"), hardlink("d", "d/f")])


def test_hardlink_to_itself_keeps_the_file(rootfs: Path) -> None:
    apply(rootfs, [file("f", b"x"), hardlink("f", "f")])
    assert (rootfs / "f").read_bytes() == b"x"


# -- whiteouts -----------------------------------------------------------------------------------


def lower_tree(rootfs: Path) -> None:
    apply(rootfs, [directory("d", mtime=5), file("d/a", b"a"), directory("d/sub"),
                   file("d/sub/x", b"x"), file("top", b"t"), directory("keep", mtime=5),
                   file("keep/k", b"k")])


def test_whiteout_removes_lower_file_and_directory(rootfs: Path) -> None:
    lower_tree(rootfs)
    apply(rootfs, [whiteout("d/a"), whiteout("d/sub"), whiteout("top"), whiteout("nothing")])
    assert listing(rootfs) == ["d", "keep", "keep/k"]
    assert (rootfs / "d").stat().st_mtime == 5  # the lower directory's mtime is restored


def test_whiteout_entries_themselves_are_never_created(rootfs: Path) -> None:
    lower_tree(rootfs)
    apply(rootfs, [opaque("d"), whiteout("keep/k"), file("keep/.wh..wh.plnk", b"aufs")])
    assert not any(".wh." in name for name in listing(rootfs))


@pytest.mark.parametrize("whiteout_first", [True, False])
def test_whiteout_never_applies_to_same_layer(rootfs: Path, whiteout_first: bool) -> None:
    lower_tree(rootfs)
    entries = [file("top", b"new top"), directory("d/sub", 0o700), file("d/sub/y", b"y")]
    outs = [whiteout("top"), whiteout("d/sub")]
    apply(rootfs, outs + entries if whiteout_first else entries + outs)
    assert (rootfs / "top").read_bytes() == b"new top"
    # the lower d/sub/x is gone either way; the same layer's d/sub/y stays
    assert listing(rootfs / "d" / "sub") == ["y"]
    assert mode_of(rootfs / "d/sub") == 0o700


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_opaque_directory_any_order(rootfs: Path, order: tuple[int, ...]) -> None:
    lower_tree(rootfs)
    pieces = [[opaque("d")], [directory("d", 0o750, mtime=9)],
              [file("d/new", b"n"), directory("d/sub"), file("d/sub/z", b"z")]]
    apply(rootfs, [entry for index in order for entry in pieces[index]])
    assert listing(rootfs / "d") == ["new", "sub", "sub/z"]
    assert mode_of(rootfs / "d") == 0o750
    assert (rootfs / "d").stat().st_mtime == 9
    assert listing(rootfs / "keep") == ["k"]


def test_opaque_without_directory_entry_keeps_later_entries(rootfs: Path) -> None:
    lower_tree(rootfs)
    apply(rootfs, [file("d/before", b"b"), opaque("d"), file("d/after", b"a")])
    assert listing(rootfs / "d") == ["after", "before"]


def test_whiteout_of_missing_parent_is_a_no_op(rootfs: Path) -> None:
    apply(rootfs, [whiteout("no/such/thing"), opaque("nodir")])
    assert listing(rootfs) == []


@pytest.mark.parametrize("name", [".wh..", ".wh...", "d/.wh."])
def test_invalid_whiteouts_are_errors(rootfs: Path, name: str) -> None:
    with pytest.raises(LayerError, match="whiteout"):
        apply(rootfs, [file(name)])


# -- bad input -----------------------------------------------------------------------------------


def test_corrupt_tar_is_a_layer_error(rootfs: Path) -> None:
    tar = bytearray(build_tar([file("a", b"x" * 2000)]))
    tar[148:156] = b"garbage!"  # header checksum
    with pytest.raises(LayerError, match="tar"):
        apply_layer(io.BytesIO(bytes(tar)), rootfs)


def test_truncated_layer_is_a_layer_error(rootfs: Path) -> None:
    tar = build_tar([file("a", os.urandom(100_000))])
    blob = zstandard.ZstdCompressor().compress(tar)
    with pytest.raises(LayerError):
        apply_layer(open_layer_stream(io.BytesIO(blob[: len(blob) // 2])), rootfs)


@pytest.mark.parametrize("size", [100, 2_000_000])  # one read, or chunks (COPY_CHUNK)
def test_a_layer_cut_in_a_files_data_or_padding_is_a_layer_error(rootfs: Path,
                                                                 size: int) -> None:
    """The data is read with its padding to the next block: a stream that ends inside either
    is an error, as tarfile's own check before the next header made it."""
    tar = build_tar([file("a", b"x" * size), file("b", b"y")])
    padding = -size % 512
    assert padding
    for cut in (512 + size // 2, 512 + size + padding // 2):
        with pytest.raises(LayerError, match="unexpected end of data"):
            apply_layer(io.BytesIO(tar[:cut]), rootfs)


def test_parent_that_is_a_file_is_a_layer_error(rootfs: Path) -> None:
    with pytest.raises(LayerError, match="not a directory"):
        apply(rootfs, [file("f", b"x"), file("f/inside", b"y")])


def test_compressed_layers_apply(rootfs: Path) -> None:
    tar = build_tar([file("z", b"zstd")])
    apply_layer(open_layer_stream(io.BytesIO(zstandard.ZstdCompressor().compress(tar))), rootfs)
    assert (rootfs / "z").read_bytes() == b"zstd"


# -- comparison with umoci -----------------------------------------------------------------------

UMOCI_LAYERS = [
    [directory("etc", mtime=100), file("etc/passwd", b"root:x:0:0::/root:/bin/sh\n"),
     file("etc/shadow", b"s", 0o000), directory("usr", mtime=100), directory("usr/bin", mtime=100),
     file("usr/bin/su", b"su", 0o4755), file("usr/bin/wall", b"wall", 0o2711),
     symlink("usr/bin/sh", "/../../bin/dash"), symlink("bin", "usr/bin"),
     file("usr/bin/dash", b"dash", 0o755), hardlink("usr/bin/ash", "usr/bin/dash"),
     directory("tmp", 0o1777), directory("var", mtime=100), directory("var/cache", mtime=100),
     file("var/cache/a", b"a"), file("var/cache/b", b"b"), directory("var/cache/sub"),
     file("var/cache/sub/c", b"c"), directory("opt", mtime=100), file("opt/x", b"x"),
     file("xattr", b"x", xattrs={"user.key": "value"}), fifo("fifo", 0o600),
     directory("dev", mtime=100), chardev("dev/null", 1, 3, 0o666),
     directory("lowdir", mtime=100), file("lowdir/f", b"f"),
     file("becomes-dir", b"f"), directory("becomes-file"), file("becomes-file/x", b"x"),
     directory("ro", 0o755, mtime=100)],
    [whiteout("var/cache/a"), opaque("opt"), file("opt/y", b"y", mtime=5),
     file("lowdir/g", b"g"), directory("becomes-dir", mtime=100), file("becomes-file", b"now"),
     hardlink("usr/bin/ash2", "usr/bin/dash"), file("usr/bin/su", b"su2", 0o4750),
     whiteout("var/cache/sub"), hardlink("etc/passwd-link", "etc/passwd"),
     file("ro/inside", b"i", 0o444)],
    [whiteout("usr/bin/ash"), symlink("lowdir/g", "/etc/passwd"), opaque("ro"),
     directory("ro", 0o555, mtime=100)],
]


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["none", "gzip", "zstd"])
def test_same_tree_as_umoci_unpack_rootless(tmp_path: Path, kind: str) -> None:
    umoci = require_binary("umoci")
    layers = [build_tar(entries) for entries in UMOCI_LAYERS]
    if kind == "zstd":
        version = subprocess.run([umoci, "--version"], capture_output=True, text=True).stdout
        if "0.4." in version:
            kind = "gzip"  # umoci 0.4 predates zstd layers; ours are covered above
    write_oci_layout(tmp_path / "image", layers, tag="t", kind=kind)
    subprocess.run([umoci, "unpack", "--rootless", "--image", f"{tmp_path / 'image'}:t",
                    str(tmp_path / "bundle")], check=True, capture_output=True)
    ours = tmp_path / "ours"
    ours.mkdir()
    warnings: list[str] = []
    for layer in layers:
        warnings += [str(w) for w in apply_layer(io.BytesIO(layer), ours).warnings]
    theirs = snapshot(tmp_path / "bundle" / "rootfs")
    mine = snapshot(ours)
    # Deliberate difference: rootless directories keep u+rwx (umoci keeps 0555 as is).
    ro_kind, ro_mode, *ro_rest = theirs["ro"]
    assert ro_mode == 0o555
    theirs["ro"] = (ro_kind, ro_mode | 0o700, *ro_rest)
    assert mine == theirs
    assert warnings == ["/dev/null: character device 1:3 replaced by an empty file (rootless)"]


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    require_root()  # mounting a tmpfs needs root
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mountpoint)],
                   check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_a_full_filesystem_is_a_layer_error_with_a_hint(tiny_tmpfs: Path) -> None:
    before = open_fds()
    rootfs = tiny_tmpfs / "rootfs"
    rootfs.mkdir()
    layer = build_tar([file(f"data/f{n}", b"y" * 100_000) for n in range(8)])
    with pytest.raises(LayerError) as raised:
        apply_layer(io.BytesIO(layer), rootfs)
    assert "No space left on device" in str(raised.value)
    assert "free some space" in (raised.value.hint or "")
    assert open_fds() == before


def test_the_report_counts_files_their_owner_may_not_read_and_hard_links(
        tmp_path: Path) -> None:
    """What cache/snapshotmodes.py needs to know to skip its walk of a new snapshot."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    report = apply_layer(io.BytesIO(build_tar([
        file("shadow", b"s", 0o000), file("wronly", b"w", 0o200), file("plain", b"p"),
        chardev("null", mode=0o000), hardlink("again", "shadow"), fifo("fifo", 0o000)])),
        rootfs)
    assert (report.unreadable, report.links) == (3, 1)  # shadow, wronly, the placeholder
    plain = apply_layer(io.BytesIO(build_tar([file("other", b"o"), fifo("f2", 0o000)])),
                        rootfs)
    assert (plain.unreadable, plain.links) == (0, 0)
