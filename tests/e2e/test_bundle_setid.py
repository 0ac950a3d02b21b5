"""An image's setuid/setgid files and file capabilities are never usable by another host user
(docs/trust.md): root's, and a normal user's, bundles (``bundle REF DEST``, cached bundles and
their snapshots, staged trees by hardlink, pool and copy, the stage pool) keep the image's
modes inside ``rootfs/`` (umoci parity), but no path another user can traverse leads to them.
A second user (``setpriv``, nobody) tries every path to every such inode: stat, open and exec
must all fail with EACCES. A group-shared cache, open to its group, strips them instead."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache.leases import Holder
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.markers import hold
from ocistage.stagers.retired import retired_versions
from pytest_ocistage.imagebuild import BuiltImage, File, build_image
from pytest_ocistage.runner import OcistageRunner

NOBODY = 65534
USER = 1000  # a normal user, who bundles and stages for itself
#: vfs_cap_data revision 2, effective, permitted = cap_dac_read_search (bit 2)
CAP_DAC_READ_SEARCH = bytes([1, 0, 0, 2, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
CAPABILITY = "security.capability"

_PROBE = r"""
import errno, json, os, subprocess, sys
def code(call):
    try:
        call()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "ok"
def run(path):
    subprocess.run([path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
def read(path):
    os.close(os.open(path, os.O_RDONLY))
print(json.dumps({path: [code(lambda: os.stat(path)), code(lambda: read(path)),
                         code(lambda: run(path))] for path in sys.argv[1:]}))
"""

pytestmark = pytest.mark.needs_root("needs root and setpriv to act as other users")


def as_user(uid: int, *argv: str, gid: int | None = None) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid if gid is None else gid}",
            "--clear-groups", *argv]


def probe_as_nobody(paths: list[Path]) -> dict[str, list[str]]:
    """What stat, open and exec of each path give to nobody: "ok" or the errno's name."""
    result = subprocess.run(as_user(NOBODY, "/usr/bin/python3", "-c", _PROBE,
                                    *map(str, paths)),
                            capture_output=True, text=True, check=True, timeout=120)
    found: dict[str, list[str]] = json.loads(result.stdout)
    return found


def privileged(st: os.stat_result, path: Path) -> bool:
    if not stat.S_ISREG(st.st_mode):
        return False
    if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        return True
    try:
        os.getxattr(path, CAPABILITY, follow_symlinks=False)
    except OSError:
        return False
    return True


def privileged_files(top: Path) -> dict[tuple[int, int], list[Path]]:
    """Every regular file below ``top`` that is setuid, setgid or has file capabilities,
    grouped by inode: each of its hard links is a path to it."""
    found: dict[tuple[int, int], list[Path]] = {}
    for directory, dirs, files in os.walk(top):
        for name in files + dirs:
            path = Path(directory) / name
            st = os.lstat(path)
            if privileged(st, path):
                found.setdefault((st.st_dev, st.st_ino), []).append(path)
    return found


def assert_unreachable(tops: list[Path]) -> int:
    """Every path to a privileged file below ``tops`` is closed to nobody (EACCES for stat,
    open and exec); returns how many paths were tried."""
    paths = [path for top in tops for links in privileged_files(top).values() for path in links]
    reached = {path: codes for path, codes in probe_as_nobody(paths).items()
               if codes != ["EACCES"] * 3}
    assert reached == {}
    return len(paths)


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory every user may traverse (as ``/scratch`` is), holding an image with a
    setuid-root ``id`` and a ``cat`` with cap_dac_read_search."""
    top = Path(tempfile.mkdtemp(prefix="ocistage-setid-", dir="/tmp"))
    shm = Path(tempfile.mkdtemp(prefix="ocistage-setid-", dir="/dev/shm"))
    try:
        top.chmod(0o755)
        shm.chmod(0o755)
        (top / "shm").symlink_to(shm)
        yield top
    finally:
        shutil.rmtree(top)
        shutil.rmtree(shm)


def setid_image(layout: Path) -> BuiltImage:
    image = build_image(layout, [{
        "bin/su-id": File(source=Path("/usr/bin/id"), mode=0o4755),
        "bin/sg-id": File(source=Path("/usr/bin/id"), mode=0o2755),
        "bin/reader": File(source=Path("/bin/cat"), mode=0o755,
                           xattrs={CAPABILITY: CAP_DAC_READ_SEARCH.decode()}),
        "bin/plain": File(source=Path("/bin/cat"), mode=0o755),
    }], cmd=["/bin/su-id"])
    subprocess.run(["chmod", "-R", "a+rX", str(layout)], check=True)
    return image


def runner_in(directory: Path, cache: Path | None = None) -> OcistageRunner:
    return OcistageRunner.in_directory(directory, cache)


def staged_everywhere(ocistage: OcistageRunner, ref: str, base: Path,
                      elsewhere: Path) -> list[Path]:
    """Bundle ``ref`` at DEST and in the cache, stage it by hardlink, copy and (to
    ``elsewhere``, another filesystem, where hardlinks fail) pool; return every directory made
    (the cache with its snapshots, the targets with their pools)."""
    dest = base / "dest"
    ocistage.run_process("bundle", ref, str(dest), check=True)
    cached = Path(ocistage.run_process("bundle", ref, check=True).stdout.strip())
    assert cached.is_relative_to(ocistage.cache)
    ocistage.run_process("stage", str(cached), "--to", str(base / "linked"), "--name", "img",
                         check=True)
    ocistage.run_process("stage", str(dest), "--to", str(base / "copied"), "--name", "img",
                         "--copy", check=True)
    pooled = elsewhere / "pooled"
    ocistage.run_process("stage", str(cached), "--to", str(pooled), "--name", "img",
                         check=True)
    for target in ("linked", "copied"):
        assert json.loads((base / target / "img" / ".ocistage-staged.json").read_text())[
            "method"] == {"linked": "hardlink", "copied": "copy"}[target]
    assert json.loads((pooled / "img" / ".ocistage-staged.json").read_text())["method"] == \
        "pool"
    return [dest, ocistage.cache, base / "linked", base / "copied", pooled]


def test_roots_bundles_and_staged_trees_keep_setid_files_out_of_others_reach(
        base: Path) -> None:
    image = setid_image(base / "layout")
    ocistage = runner_in(base / "root")
    tops = staged_everywhere(ocistage, image.ref, base, (base / "shm").resolve())
    su_id = base / "dest" / "rootfs" / "bin" / "su-id"
    # the container sees the image's modes and capabilities (umoci parity)...
    assert os.stat(su_id).st_mode & 0o7777 == 0o4755 and os.stat(su_id).st_uid == 0
    assert os.getxattr(base / "dest/rootfs/bin/reader", CAPABILITY) == CAP_DAC_READ_SEARCH
    for top in tops:  # su-id and sg-id everywhere; reader's capability where xattrs are kept
        assert len(privileged_files(top)) >= (3 if top in tops[:2] else 2), top
    # ...and rootfs/ keeps its own mode, which a non-root container user needs
    assert stat.S_IMODE(os.stat(base / "dest" / "rootfs").st_mode) == 0o755
    # but no other user of the host reaches any of them, by any hard link
    assert assert_unreachable(tops) >= 5 * 3
    pool = tops[-1] / ".ocistage-pool"
    for directory in (base / "dest", base / "linked/img", base / "copied/img", pool,
                      *ocistage.cache.glob("snapshots/*"), *ocistage.cache.glob("bundles/*")):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory


def test_a_restage_and_a_retired_version_stay_private(base: Path) -> None:
    image = setid_image(base / "layout")
    ocistage = runner_in(base / "root")
    dest, to = base / "dest", base / "t"
    ocistage.run_process("bundle", image.ref, str(dest), check=True)
    first = stage_directory(dest, to, cache_root=ocistage.cache, name="img", link=False)
    job = subprocess.Popen(["sleep", "300"])  # a job running the first version
    try:
        hold(ocistage.cache, first.path, Holder("pid", host=socket.gethostname(),
                                                 pid=job.pid))
        (dest / "rootfs" / "new").write_text("changed\n")
        stage_directory(dest, to, cache_root=ocistage.cache, name="img", link=False)
        [retired] = retired_versions(to, "img")
        assert stat.S_IMODE(os.stat(retired).st_mode) == 0o700
        # a copy keeps the file capability too (issue 27.8: xattrs are copied where
        # permitted, root here), unreachable to others all the same
        assert len(privileged_files(retired)) == 3
        assert assert_unreachable([to]) >= 2 * 2  # the new version and the retired one
    finally:
        job.kill()
        job.wait()


def test_a_users_bundles_keep_its_setuid_files_from_other_users(base: Path) -> None:
    image = setid_image(base / "layout")
    home, elsewhere = base / "user", (base / "shm").resolve() / "user"
    for directory in (home, elsewhere):
        directory.mkdir()
        os.chown(directory, USER, USER)
    ocistage = runner_in(home)
    as_them = dataclasses.replace(ocistage, command=tuple(as_user(USER, *ocistage.command)))
    tops = staged_everywhere(as_them, image.ref, home, elsewhere)
    su_id = home / "dest" / "rootfs" / "bin" / "su-id"
    assert os.stat(su_id).st_uid == USER and os.stat(su_id).st_mode & 0o7777 == 0o4755
    assert assert_unreachable(tops) >= 5 * 2  # su-id and sg-id (no capabilities unprivileged)


def test_a_group_shared_cache_strips_setid_bits_and_capabilities(base: Path) -> None:
    image = setid_image(base / "layout")
    cache = base / "shared-cache"
    cache.mkdir()
    cache.chmod(0o2775)
    ocistage = runner_in(base / "root", cache)
    result = ocistage.run_process("bundle", image.ref, check=True)
    cached = Path(result.stdout.strip())
    assert "3 file(s) of the image lost their setuid/setgid bits and file capabilities: " \
           "the cache is group-shared" in result.stderr
    snapshots = list(cache.glob("snapshots/*"))
    assert snapshots and all(os.stat(s).st_mode & stat.S_ISGID for s in snapshots)
    assert privileged_files(cache) == {}
    rootfs = cached / "rootfs"
    assert os.stat(rootfs / "bin/su-id").st_mode & 0o7777 == 0o755
    assert os.stat(rootfs / "bin/sg-id").st_mode & 0o7777 == 0o755
    with pytest.raises(OSError) as missing:
        os.getxattr(rootfs / "bin/reader", CAPABILITY)
    assert missing.value.errno == errno.ENODATA
    # a bundle at DEST made from that snapshot says so too, and is private all the same
    again = ocistage.run_process("bundle", image.ref, str(base / "dest"), check=True)
    assert "the cache is group-shared" in again.stderr
    assert stat.S_IMODE(os.stat(base / "dest").st_mode) == 0o700


def test_a_squashfs_staging_keeps_them_out_of_reach_mounted_or_unpacked(base: Path) -> None:
    image = setid_image(base / "layout")
    ocistage = runner_in(base / "root")
    ocistage.run_process("bundle", image.ref, str(base / "dest"), check=True)
    # a source directory others may enter (as a user's own tree may be)
    (base / "dest").chmod(0o755)
    ocistage.run_process("stage", str(base / "dest"), "--to", str(base / "sq"), "--name",
                         "img", "--format", "squashfs", "--unpack", check=True)
    assert privileged_files(base / "sq" / "img") == {}  # stripped, as it always was
    mountable = shutil.which("squashfuse") is not None and os.path.exists("/dev/fuse")
    if not mountable:
        return
    ocistage.run_process("stage", str(base / "dest"), "--to", str(base / "mnt"), "--name",
                         "img", "--format", "squashfs", "--mount", check=True)
    try:
        mounted = base / "mnt" / "img"
        assert os.path.ismount(mounted)
        assert stat.S_IMODE(os.stat(mounted).st_mode) == 0o700
        assert os.stat(mounted / "rootfs/bin/su-id").st_mode & 0o7777 == 0o4755
        assert assert_unreachable([mounted]) >= 2
    finally:
        ocistage.run_process("unstage", str(base / "mnt" / "img"), check=True)
    (base / "dest").chmod(0o700)
