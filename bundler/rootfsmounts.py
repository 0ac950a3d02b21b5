"""The mount points a bundle's mounts need, made in its rootfs before it is published.

An image built ``FROM scratch`` often has no ``/proc``, ``/dev`` or ``/sys``. runc and crun
make a missing mount point in the rootfs when the container starts, so a bundle on a shared
filesystem that ``srun -N3 --container=BUNDLE`` starts on three nodes at once has three runtimes
racing to make the same names, and the losers fail (crun: ``cannot mkdir `proc`: File
exists``). So the bundle gets them when it is built, privately, before the ``rename()`` that
publishes it (:mod:`ocistage.bundler.flows.bundle`): which ones and of which kind is the rule of
:func:`ocistage.stagers.mountrule.mount_points` (a squashfs image made of any bundle adds the
same ones). A bind whose source this host does not have is left to the runtime, which knows on
the node what the source is.

Made through :class:`ocistage.bundler.unpack.safepath.SafeRoot` without following any symlink:
a destination the image has (as anything: a symlink, a file, a directory), or one below a
symlink or a file of the image, is left as it is (the runtime resolves it inside the rootfs, as
it always did). A made directory is 0755, a made file 0644 and empty, both dated
:data:`MOUNT_POINT_TIME_NS` (hidden under the mount once the container runs), and the directory
they were made in gets its times back: bundles of one image hold the same tree whether they were
copied, hard-linked or cached, and the bundle of an image that has every mount point is exactly
the image's tree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ocistage.bundler.unpack.safepath import Parts, SafeRoot, open_readable_dir
from ocistage.stagers.mountrule import Kind, mount_points

MOUNT_POINT_TIME_NS = 0
"""The access and modification time of a mount point made here: fixed, so that every bundle of
an image has the same tree (the rootfs's own time is when it was made, never the same twice)."""

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def make_mount_points(rootfs: Path, mounts: Sequence[Mapping[str, Any]]) -> list[str]:
    """Make the missing mount points of ``mounts`` (a runtime config's) in ``rootfs``, a
    private tree being built; what was made, as ``/path`` inside the rootfs, parents first."""
    made: list[str] = []
    with SafeRoot(rootfs) as root:
        for point in mount_points(mounts):
            if point.kind is not None:
                made.extend(_make(root, point.parts, point.kind))
    return made


def _make(root: SafeRoot, parts: Parts, kind: Kind) -> list[str]:
    """Make ``parts`` (a ``kind``) and its missing parents below the deepest directory on the
    way that exists."""
    parent = parts[:-1]
    depth = len(parent)
    found = root.resolve_dir(parent, follow=False)
    while found is None and depth > 0:
        depth -= 1
        found = root.resolve_dir(parent[:depth], follow=False)
    if found is None:
        return []
    try:
        os.lstat(parts[depth], dir_fd=found[0])
        return []  # the image's, or not a directory on the way: the runtime's to resolve
    except FileNotFoundError:
        pass
    base_fd = open_readable_dir(found[0])  # held over the lookups that follow
    try:
        base = os.stat(base_fd)
        created: list[Parts] = []
        # parts[depth] is missing: every directory from there on is made now, in a private tree
        made = root.resolve_dir(parent, create=True, follow=False, on_create=created.append)
        assert made is not None
        if kind == "d":
            os.mkdir(parts[-1], 0o755, dir_fd=made[0])
        else:
            os.close(os.open(parts[-1], _NEW_FILE, 0o644, dir_fd=made[0]))
        created.append(parts)
        for path in created:
            _set_time(root, path)
        os.utime(base_fd, ns=(base.st_atime_ns, base.st_mtime_ns))
    finally:
        os.close(base_fd)
    return ["/" + "/".join(path) for path in created]


def _set_time(root: SafeRoot, path: Parts) -> None:
    found = root.resolve_dir(path[:-1], follow=False)
    if found is not None:
        os.utime(path[-1], ns=(MOUNT_POINT_TIME_NS, MOUNT_POINT_TIME_NS), dir_fd=found[0],
                 follow_symlinks=False)
