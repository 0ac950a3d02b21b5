"""``--format squashfs``: one compressed image per bundle, mounted or unpacked on the node.

A shared filesystem serves one big file far better than thousands of small ones. The staged
form is ``TO/NAME.sqfs`` (``mksquashfs`` with zstd) plus ``TO/NAME``, which is either a
``squashfuse`` mount of the image (rootless FUSE; method ``squashfs-mount``) or, where FUSE is
not usable, the image unpacked with ``unsquashfs`` and published like a directory bundle
(method ``squashfs-unpack``). The image holds the tree, the manifest and the marker; its
``config.json`` has ``root.readonly = true`` because the mount is read-only.

The image is built in ``TO/.ocistage-tmp/`` and renamed into place, so ``TO/NAME.sqfs`` is
never half written. Re-staging an unchanged source (same manifest by stat) does nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from cache.fsops import remove_tree
from cache.leases import Holder
from cache.staged import unmount as unmount
from stagers.filemanifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    Entry,
    Manifest,
    StageError,
    fill_hashes,
    scan,
    unchanged,
)
from stagers.markers import Marker, claim, new_marker, release_if_unused
from stagers.target import (
    LOCK_TIMEOUT,
    StageResult,
    clean_leftovers,
    drop_scratch,
    existing,
    name_lock,
    new_scratch,
    publish,
    readonly_config,
)

IMAGE_SUFFIX = ".sqfs"
TOOL_TIMEOUT = 3600


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise StageError(f"{name} is not installed",
                         "install squashfs-tools (and squashfuse to mount images), or use "
                         "--format dir")
    return path


def _run(argv: list[str], what: str) -> None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT,
                                stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise StageError(f"{what} failed: {exc}") from exc
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise StageError(f"{what} failed: {detail[-1] if detail else result.returncode}")


def missing_mountpoints(source: Path) -> list[tuple[str, str]]:
    """Mount destinations of ``source/config.json`` missing from its rootfs, as (path inside
    the image, "d" or "f"), parents first.

    A mounted image is read-only, so runc cannot create them at start (it would fail with
    ENOSYS/EROFS): they are added to the image as empty directories or files. Destinations
    inside another mount (``/dev/pts`` under the ``/dev`` tmpfs) are created there by runc.
    """
    try:
        config = json.loads((source / "config.json").read_bytes())
        root = str(config["root"]["path"]).strip("/") or "rootfs"
        mounts = config.get("mounts", [])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if "/" in root or root in (".", ".."):
        return []
    destinations = [str(m.get("destination", "")).rstrip("/") for m in mounts
                    if isinstance(m, dict)]
    result: list[tuple[str, str]] = []
    seen: set[str] = set()
    for mount, destination in zip(mounts, destinations, strict=True):
        parts = [p for p in destination.split("/") if p]
        if (not parts or ".." in parts or any(c.isspace() for c in destination)
                or any(destination.startswith(other + "/") for other in destinations
                       if other and other != destination)):
            continue
        source_path = str(mount.get("source", ""))
        kind = "f" if mount.get("type") == "bind" and os.path.isfile(source_path) else "d"
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            if rel in seen:
                continue
            seen.add(rel)
            if os.path.lexists(source / root / rel):
                continue
            result.append((f"{root}/{rel}", kind if depth == len(parts) else "d"))
    return result


def build_image(source: Path, image: Path, extra: Path | None = None, jobs: int = 2) -> None:
    """Make ``image`` from ``source`` (zstd); the files in ``extra`` replace top-level ones.

    ``image`` must not exist. Ownership is stored as found (a rootless bundle is the user's).
    Missing mount points of the bundle's config.json are added (:func:`missing_mountpoints`).
    """
    mksquashfs = _tool("mksquashfs")
    argv = [mksquashfs, os.fspath(source), os.fspath(image), "-comp", "zstd", "-noappend",
            "-no-progress", "-quiet", "-no-recovery", "-processors", str(max(1, jobs))]
    uid, gid = os.getuid(), os.getgid()
    for path, kind in missing_mountpoints(source):
        argv += ["-p", f"{path} d 755 {uid} {gid}" if kind == "d"
                 else f"{path} f 644 {uid} {gid} true"]
    excluded = [MANIFEST_NAME, MARKER_NAME]
    if extra is not None:
        excluded += [name for name in os.listdir(extra) if name not in excluded]
    present = [name for name in excluded if os.path.lexists(source / name)]
    if present:
        argv += ["-e", *present]
    _run(argv, f"mksquashfs of {source}")
    if extra is not None:
        _run([mksquashfs, os.fspath(extra), os.fspath(image), "-no-progress", "-quiet",
              "-no-recovery"], f"adding ocistage files to {image.name}")


def mount(image: Path, mountpoint: Path) -> bool:
    """Mount ``image`` at the empty directory ``mountpoint`` with squashfuse; False if FUSE is
    not usable here (no squashfuse, no /dev/fuse, no fusermount for an unprivileged user)."""
    squashfuse = shutil.which("squashfuse")
    if squashfuse is None or not os.path.exists("/dev/fuse"):
        return False
    if os.geteuid() != 0 and not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return False
    # The container's processes run under other (mapped) uids than the mounting user, so
    # the mount must allow other users; default_permissions makes the kernel check the
    # image's modes and owners as on a directory bundle. An unprivileged user may lack
    # user_allow_other in /etc/fuse.conf: then mount for the user alone.
    for options in (["-o", "allow_other,default_permissions"], []):
        result = subprocess.run([squashfuse, *options, os.fspath(image), os.fspath(mountpoint)],
                                capture_output=True, text=True, timeout=60,
                                stdin=subprocess.DEVNULL, check=False)
        if result.returncode == 0 and os.path.ismount(mountpoint):
            return True
    return False


def unpack(image: Path, dest: Path) -> None:
    """Unpack ``image`` into ``dest`` (must not exist) with unsquashfs."""
    _run([_tool("unsquashfs"), "-d", os.fspath(dest), "-no-progress", os.fspath(image)],
         f"unsquashfs of {image.name}")


def _readonly_config_file(source: Path, extra: Path) -> None:
    config = source / "config.json"
    if not config.is_file() or config.is_symlink():
        return
    data = readonly_config(config.read_bytes())
    if data is not None:
        (extra / "config.json").write_bytes(data)


def stage_squashfs(source: Path, to: Path, name: str, *, cache_root: Path, holder: Holder,
                   label: str, mount_image: bool | None = None, jobs: int = 8) -> StageResult:
    """Stage ``source`` as ``to/name.sqfs`` + ``to/name`` (mounted or unpacked)."""
    final = to / name
    image = to / f"{name}{IMAGE_SUFFIX}"
    lock = name_lock(to, name)
    lock.acquire(timeout=LOCK_TIMEOUT)
    lease, taken = claim(cache_root, final, holder)  # before looking at what is staged
    try:
        clean_leftovers(to, name)
        previous, marker = existing(final)
        if os.path.lexists(final) and marker is None and not _empty_dir(final):
            raise StageError(f"{final} exists and was not staged by ocistage",
                             "choose another --name or target, or remove it yourself")
        if marker is not None and marker.format != "squashfs":
            raise StageError(f"{final} holds a staged directory bundle, not a squashfs image",
                             f"unstage it first (ocistage unstage {final}) or use --name")
        entries = scan(source)
        files = sum(1 for e in entries if e.type == "file")
        if (previous is not None and marker is not None and marker.format == "squashfs"
                and unchanged(entries, previous)):
            return StageResult(final, files, 0, 0, files, 0, lease.id, marker.method)
        entries, _ = fill_hashes(source, entries, previous, jobs)
        scratch = new_scratch(to, name)
        try:
            method = "squashfs-mount" if mount_image is not False else "squashfs-unpack"
            built = make_image(source, entries, scratch, image.name,
                               new_marker(lease, label, method, "squashfs", image.name), jobs)
            return install_image(built, final, scratch, files, lease.id, label, mount_image)
        except BaseException:
            with contextlib.suppress(OSError):
                drop_scratch(scratch)
            raise
    except BaseException as exc:
        release_if_unused(cache_root, final, lease, taken)
        if isinstance(exc, OSError):
            raise StageError(f"staging {source} as squashfs at {final} failed: "
                             f"{exc.strerror} ({exc.filename})") from exc
        raise
    finally:
        lock.release()


def make_image(source: Path, entries: list[Entry], scratch: Path, image_name: str,
               marker: Marker, jobs: int = 8) -> Path:
    """Build ``scratch/image_name`` from ``source`` with its manifest (``entries`` with hashes),
    ``marker`` and a read-only-root ``config.json``; returns its path."""
    extra = scratch / "extra"
    extra.mkdir()
    _readonly_config_file(source, extra)
    manifest = Manifest(tuple(entries), method="squashfs", readonly_root=True)
    (extra / MANIFEST_NAME).write_bytes(manifest.to_json())
    (extra / MARKER_NAME).write_bytes(marker.to_json())
    built = scratch / image_name
    build_image(source, built, extra, jobs=min(jobs, os.cpu_count() or 1))
    return built


def install_image(built: Path, final: Path, scratch: Path, files: int, lease_id: str,
                  label: str, mount_image: bool | None) -> StageResult:
    """Move the image ``built`` (in ``scratch``) to ``final.sqfs`` and mount or unpack it at
    ``final``; removes ``scratch``. The caller holds the name lock."""
    image = final.with_name(final.name + IMAGE_SUFFIX)
    _take_down(final)
    os.rename(built, image)
    size = os.path.getsize(image)
    if not os.path.isdir(final):
        os.mkdir(final, 0o755)
    if mount_image is not False and mount(image, final):
        drop_scratch(scratch)
        return StageResult(final, files, files, 0, 0, size, lease_id, "squashfs-mount")
    if mount_image is True:
        raise StageError(f"cannot mount {image} with squashfuse",
                         "install squashfuse and fuse3, or let ocistage unpack it")
    unpacked = scratch / "bundle"
    unpack(image, unpacked)
    # the marker inside the image says how it was meant to be used; record what was done
    with contextlib.suppress(FileNotFoundError):
        os.unlink(unpacked / MARKER_NAME)
    marker = Marker(id=lease_id, source=label, created=time.time(), method="squashfs-unpack",
                    format="squashfs", image=image.name)
    (unpacked / MARKER_NAME).write_bytes(marker.to_json())
    os.chmod(unpacked, 0o755)
    if _empty_dir(final):
        os.rmdir(final)
    old = publish(unpacked, final)
    if old is not None:
        remove_tree(old)
    drop_scratch(scratch)
    return StageResult(final, files, files, 0, 0, size, lease_id, "squashfs-unpack")


def _empty_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not path.is_symlink() and not any(path.iterdir())
    except OSError:
        return False


def _take_down(final: Path) -> None:
    """Unmount a previous image at ``final`` (an unpacked previous version stays until the new
    one replaces it)."""
    if os.path.ismount(final):
        unmount(final)
