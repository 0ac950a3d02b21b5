"""Whether hard links and reflinks work between two places, tried for real with probe files."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ocistage.cache.fdio import reflink

#: ``link()`` errors that mean "no hard link here, copy instead": another mount (two mount
#: points of one filesystem give EXDEV although ``st_dev`` is the same), a source we do not
#: own under ``protected_hardlinks``, a file at its link limit
LINK_REFUSED = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK})


def link_refused(exc: OSError) -> bool:
    """Whether ``exc`` from ``link()`` means the caller should copy instead."""
    return exc.errno in LINK_REFUSED


def hardlinks_work(source: Path, directory: Path) -> bool:
    """Whether the regular file ``source`` can be hard-linked into ``directory``: tried for
    real with a probe name that is removed again (comparing ``st_dev`` is not enough)."""
    probe = directory / f".ocistage-link-probe-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        os.link(source, probe, follow_symlinks=False)
    except OSError as exc:
        if link_refused(exc):
            return False
        raise
    os.unlink(probe)
    return True


def reflinks_work(source_dir: Path, directory: Path) -> bool:
    """Whether a file in ``source_dir`` can be cloned into ``directory`` by reflink (FICLONE:
    btrfs, XFS, bcachefs; the two on one filesystem): tried for real with two probe files
    that are removed again. A reflinked copy shares extents, so it costs metadata only."""
    tag = f".ocistage-reflink-probe-{os.getpid()}-{os.urandom(4).hex()}"
    source, probe = source_dir / tag, directory / tag
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        src_fd = os.open(source, flags, 0o600)
    except OSError:
        return False
    try:
        os.write(src_fd, b"x")
        dst_fd = os.open(probe, flags, 0o600)
        try:
            return reflink(src_fd, dst_fd)
        finally:
            os.close(dst_fd)
            os.unlink(probe)
    except OSError:
        return False
    finally:
        os.close(src_fd)
        os.unlink(source)
