"""The filesystems the benches run on: what a directory's filesystem is (:func:`describe`), and
a journaled ext4 made for one measurement (:func:`journaled_ext4`).

The importer's cold get and ``enroot import`` unpack thousands of files and remove them again.
On an ext4 without a journal the kernel's inode allocator checks every candidate inode for a
recent deletion (``recently_deleted`` in ``fs/ext4/ialloc.c``, done only when there is no
journal), which put 80% of the unpack's CPU in the allocator on this machine's root
filesystem after a few runs. ``mkfs.ext4``'s default has a journal, as the node-local disks of
a cluster have (ext4 or XFS): :func:`journaled_ext4` makes one in an image file on the same
disk, loop-mounted (root only), so that a goal can be measured on both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ocistage.cache.sizes import parse_size


class NoFilesystem(RuntimeError):
    """A journaled ext4 cannot be made here (not root, no mkfs.ext4, no loop device)."""


def mount_of(path: Path) -> tuple[str, str, str]:
    """(mount point, filesystem type, source) of the mount holding ``path``, from
    /proc/self/mountinfo (the longest mount point above it)."""
    target = os.path.realpath(path)
    best = ("/", "", "")
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as info:
        for line in info:
            fields = line.split()
            separator = fields.index("-")
            point = fields[4].replace("\\040", " ")
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[0]):
                best = (point, fields[separator + 1], fields[separator + 2])
    return best


def has_journal(source: str) -> bool:
    """Whether the ext4 on block device ``source`` has a journal (jbd2 lists it)."""
    name = os.path.basename(source)
    jbd2 = Path("/proc/fs/jbd2")
    return jbd2.is_dir() and any(entry.name.rsplit("-", 1)[0] == name
                                 for entry in jbd2.iterdir())


def describe(path: Path) -> str:
    """``path``'s filesystem in words: ``tmpfs``, ``ext4``, ``ext4 without a journal``, ..."""
    _point, kind, source = mount_of(path)
    if kind == "ext4" and not has_journal(source):
        return "ext4 without a journal"
    return kind or "unknown"


def why_no_journaled_ext4() -> str | None:
    """Why :func:`journaled_ext4` cannot work here, or None."""
    if os.geteuid() != 0:
        return "making a loop-mounted ext4 needs root"
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing (e2fsprogs, mount)"
    if not os.path.exists("/dev/loop-control"):
        return "there is no loop device (/dev/loop-control)"
    return None


@contextmanager
def journaled_ext4(where: Path, size: str = "8G") -> Iterator[Path]:
    """A fresh ext4 with ``mkfs.ext4``'s defaults (a journal), of ``size``, in a sparse image
    file under ``where``, loop-mounted (mode 1777, as /tmp) for the block; unmounted and its
    image removed after. Raises :class:`NoFilesystem` when it cannot be made."""
    why = why_no_journaled_ext4()
    if why is not None:
        raise NoFilesystem(why)
    home = where / f"ext4-{os.getpid()}"
    home.mkdir(parents=True)
    image, mountpoint = home / "image", home / "mnt"
    mountpoint.mkdir()
    mounted = False
    try:
        with open(image, "wb") as out:
            out.truncate(parse_size(size))
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, timeout=300,
                       stdin=subprocess.DEVNULL, capture_output=True)
        try:
            subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)], check=True,
                           timeout=60, stdin=subprocess.DEVNULL, capture_output=True)
        except subprocess.CalledProcessError as exc:
            raise NoFilesystem(f"mount -o loop failed: {exc.stderr.decode().strip()}") from exc
        mounted = True
        os.chmod(mountpoint, 0o1777)
        yield mountpoint
    finally:
        if mounted:
            subprocess.run(["umount", str(mountpoint)], check=True, timeout=300,
                           stdin=subprocess.DEVNULL)
        shutil.rmtree(home)
