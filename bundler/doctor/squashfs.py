"""The doctor's checks of what squashfs stages need: FUSE (``/dev/fuse``, fusermount,
fuse.conf), squashfuse, mksquashfs and its compressors, unsquashfs."""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from ocistage.bundler.doctor.probes import command_output, read_text, user_name
from ocistage.bundler.doctor.report import Check, missing, ok, warn


@dataclass(frozen=True)
class FuseFacts:
    """What a squashfuse mount needs: /dev/fuse, fusermount for a user, fuse.conf."""

    device: os.stat_result | None
    usable: bool  # the caller may open /dev/fuse read-write
    fusermount: bool
    fuse_conf: str | None


def check_fuse(facts: FuseFacts, uid: int) -> Check:
    """Whether squashfuse can mount here (``stage --format squashfs`` mounts its image, and
    unpacks it with unsquashfs when it cannot)."""
    fallback = "squashfs stages are unpacked instead of mounted"
    if facts.device is None or not stat.S_ISCHR(facts.device.st_mode):
        return warn("fuse", f"no /dev/fuse: {fallback}", "as root: modprobe fuse")
    mode = stat.filemode(facts.device.st_mode)
    if not facts.usable:
        return warn("fuse", f"/dev/fuse ({mode} {user_name(facts.device.st_uid)}) is not "
                            f"open to you: {fallback}", "as root: chmod 666 /dev/fuse")
    if uid != 0 and not facts.fusermount:
        return warn("fuse", f"no fusermount/fusermount3: {fallback}", "apt install fuse3")
    allow_other = any(line.strip() == "user_allow_other"
                      for line in (facts.fuse_conf or "").splitlines())
    if uid != 0 and not allow_other:
        return warn("fuse", "/etc/fuse.conf lacks user_allow_other: a squashfs mount is "
                            "yours alone (a container user other than you cannot read it)",
                    "as root: add user_allow_other to /etc/fuse.conf")
    return ok("fuse", f"/dev/fuse ({mode}) usable")


def check_squashfuse(squashfuse: str | None, squashfuse_ll: str | None) -> Check:
    found = [path for path in (squashfuse, squashfuse_ll) if path]
    if squashfuse is None:
        return missing("squashfuse", "squashfuse is not on PATH: squashfs stages are unpacked "
                                     "instead of mounted" + (f" ({squashfuse_ll} alone is not "
                                                             "used)" if squashfuse_ll else ""),
                       "apt install squashfuse")
    return ok("squashfuse", ", ".join(found))


def check_mksquashfs(mksquashfs: str | None, help_text: str | None,
                     unsquashfs: str | None) -> Check:
    """mksquashfs and its compressors: ``stage --format squashfs`` writes zstd, the pyxis
    importer zstd or gzip; unsquashfs unpacks an image where FUSE does not mount it."""
    from ocistage.stagers.mksquashfs import compressors_listed

    if mksquashfs is None:
        return missing("mksquashfs", "mksquashfs is not on PATH: no stage --format squashfs, "
                                     "no ocistage-pyxis-importer", "apt install squashfs-tools")
    listed = compressors_listed(help_text or "")
    if not listed:
        return warn("mksquashfs", f"{mksquashfs} -help lists no compressors",
                    "install squashfs-tools 4.4 or later")
    shown = f"compressors {', '.join(listed)}"
    if "zstd" not in listed:
        return warn("mksquashfs", f"{shown}: no zstd, which stage --format squashfs writes",
                    "install a squashfs-tools built with zstd")
    if unsquashfs is None:
        return warn("mksquashfs", f"{shown}; no unsquashfs (squashfs stages where FUSE "
                                  "cannot mount)", "apt install squashfs-tools")
    return ok("mksquashfs", shown)


def squashfs_checks(uid: int) -> list[Check]:
    try:
        device: os.stat_result | None = os.stat("/dev/fuse")
    except OSError:
        device = None
    facts = FuseFacts(device, os.access("/dev/fuse", os.R_OK | os.W_OK),
                      bool(shutil.which("fusermount3") or shutil.which("fusermount")),
                      read_text(Path("/etc/fuse.conf")))
    mksquashfs = shutil.which("mksquashfs")
    return [check_fuse(facts, uid),
            check_squashfuse(shutil.which("squashfuse"), shutil.which("squashfuse_ll")),
            check_mksquashfs(mksquashfs, command_output(["mksquashfs", "-help"])
                             if mksquashfs else None, shutil.which("unsquashfs"))]
