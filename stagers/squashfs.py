"""``--format squashfs``: one compressed image per bundle, mounted or unpacked on the node.

A shared filesystem serves one big file far better than thousands of small ones. The staged
form is ``TO/NAME.sqfs`` (``mksquashfs`` with zstd level 3, 128 KiB blocks: :data:`COMPRESSION`)
plus ``TO/NAME``, which is either a
``squashfuse_ll`` (else ``squashfuse``) mount of the image (rootless FUSE; method
``squashfs-mount``) or, where FUSE is not usable, the image unpacked with ``unsquashfs`` and
published like a directory bundle (method ``squashfs-unpack``). The image holds the tree, the
manifest and the marker; its ``config.json`` has ``root.readonly = true`` because the mount is
read-only.

The image is built in the caller's scratch dir of ``TO`` (``.ocistage-tmp/``, per user in a
shared target: :func:`ocistage.cache.targetlayout.tmp_name`) and renamed into place, so
``TO/NAME.sqfs`` is never half written. Re-staging an unchanged source (same manifest by
stat) does nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

from ocistage.cache.cpus import usable_cpus
from ocistage.cache.errors import StoreError
from ocistage.cache.privatedirs import PRIVATE_DIR_MODE
from ocistage.cache.privileges import strip_privileges
from ocistage.cache.targetlayout import image_path
from ocistage.cache.targetlayout import unmount as unmount
from ocistage.cache.unpackbudget import ENTRY_CHARGE, UnpackBudget, default_unpack_limit
from ocistage.stagers.errors import StageError
from ocistage.stagers.filemanifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    Entry,
    Manifest,
    fill_hashes,
    scan,
    unchanged,
)
from ocistage.stagers.markers import Marker
from ocistage.stagers.mksquashfs import (
    BLOCK_SIZE,
    ImageProgress,
    pseudo_dir,
    pseudo_file,
    pseudo_name,
    run_tool,
)
from ocistage.stagers.mountrule import mount_points
from ocistage.stagers.target import StageResult, readonly_config, write_private
from ocistage.stagers.transaction import Staging


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise StageError(f"{name} is not installed",
                         "install squashfs-tools (and squashfuse to mount images), or use "
                         "--format dir")
    return path


def missing_mountpoints(source: Path) -> list[tuple[tuple[str, ...], str]]:
    """Mount points of ``source/config.json`` (:func:`ocistage.stagers.mountrule.mount_points`)
    missing from its rootfs, as (path inside the image as components, "d" or "f"), parents
    first.

    A mounted image is read-only, so runc cannot create them at start (it would fail with
    ENOSYS/EROFS): they are added to the image as empty directories or files, a directory for
    a bind whose source is not on this host. Bundles made by ``ocistage bundle`` have them
    already (:mod:`ocistage.bundler.rootfsmounts`); other bundles may not. Any name is carried
    (white space, quotes, newlines: :func:`~ocistage.stagers.mksquashfs.pseudo_name`); one that
    no image can hold is a :class:`~ocistage.stagers.errors.PseudoNameError`.
    """
    layout = _mount_layout(source)
    if layout is None:
        return []
    root, mounts = layout
    result: list[tuple[tuple[str, ...], str]] = []
    seen: set[tuple[str, ...]] = set()
    for point in mount_points(mounts):
        pseudo_name((root, *point.parts))  # refused before any path is looked at
        result.extend(_missing_along(source / root, root, point.parts, point.kind or "d", seen))
    return result


def _mount_layout(source: Path) -> tuple[str, Any] | None:
    """The rootfs directory (one name) and the mounts of ``source/config.json``; None when
    it cannot be read or its root is no plain name. Mounts that are not a list of JSON
    objects are a :class:`StageError` (the runtime would refuse the bundle too)."""
    try:
        config = json.loads((source / "config.json").read_bytes())
        root = str(config["root"]["path"]).strip("/") or "rootfs"
        mounts = config.get("mounts") or []
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if "/" in root or root in (".", ".."):
        return None
    if not isinstance(mounts, list) or not all(isinstance(m, dict) for m in mounts):
        raise StageError(f"{source / 'config.json'}: \"mounts\" is not a list of objects",
                         "fix the bundle's config.json: each mount is a JSON object with a "
                         "\"destination\"")
    return root, mounts


def _missing_along(rootfs: Path, root: str, parts: tuple[str, ...], kind: str,
                   seen: set[tuple[str, ...]]) -> list[tuple[tuple[str, ...], str]]:
    """The directories leading to the mount point ``parts`` and the mount point itself (a
    ``kind``) that ``rootfs`` lacks, as (path in the image, "d" or "f"); paths in ``seen``
    were looked at already (``seen`` gets the others)."""
    missing = []
    for depth in range(1, len(parts) + 1):
        rel = parts[:depth]
        if rel in seen:
            continue
        seen.add(rel)
        if os.path.lexists(rootfs.joinpath(*rel)):
            continue
        missing.append(((root, *rel), kind if depth == len(parts) else "d"))
    return missing


#: mksquashfs's compression for staged images, chosen by measured build, size and read times
#: (docs/squashfs-parameters.md, ``python -m bench squashfs``): zstd at level 3 built 5-20x
#: faster than mksquashfs's default level 15 for images 8-13% larger (the importer's level
#: too); the block size is :data:`~ocistage.stagers.mksquashfs.BLOCK_SIZE`. Readers take both
#: from the image's superblock, so images made with other parameters stay valid, and an
#: unchanged source is not rebuilt.
COMPRESSION = ("-comp", "zstd", "-Xcompression-level", "3")


def build_image(source: Path, image: Path, extra: Path | None = None, jobs: int = 2,
                progress: ImageProgress | None = None, root_mode: int | None = None) -> None:
    """Make ``image`` from ``source`` (:data:`COMPRESSION`, 128 KiB blocks); the files
    in ``extra`` replace top-level ones.

    ``image`` must not exist. Ownership is stored as found (a rootless bundle is the user's).
    ``root_mode``: the mode of the image's root directory (default: ``source``'s).
    Missing mount points of the bundle's config.json are added (:func:`missing_mountpoints`).
    ``progress`` is told ``(0, 0)`` when mksquashfs starts, then how far it is, from its
    progress bar.
    """
    mksquashfs = _tool("mksquashfs")
    argv = [mksquashfs, os.fspath(source), os.fspath(image), *COMPRESSION, "-b", BLOCK_SIZE,
            "-noappend", "-quiet", "-no-recovery", "-processors", str(max(1, jobs))]
    if progress is None:
        argv.append("-no-progress")
    rooted = [] if root_mode is None else ["-root-mode", f"{root_mode:o}"]
    argv += rooted
    uid, gid = os.getuid(), os.getgid()
    for parts, kind in missing_mountpoints(source):
        argv += ["-p", pseudo_dir(parts, 0o755, uid, gid) if kind == "d"
                 else pseudo_file(parts, 0o644, uid, gid, "true")]
    excluded = [MANIFEST_NAME, MARKER_NAME]
    if extra is not None:
        excluded += [name for name in os.listdir(extra) if name not in excluded]
    present = [name for name in excluded if os.path.lexists(source / name)]
    if present:
        argv += ["-e", *present]
    if progress is None:
        run_tool(argv, f"mksquashfs of {source}", output=image)
    else:
        progress(0, 0)  # it starts: mksquashfs draws no bar before it has read the tree
        run_tool(argv, f"mksquashfs of {source}", progress=progress, output=image)
    if extra is not None:
        # appending sets the root directory's mode again (from extra's, unless told)
        run_tool([mksquashfs, os.fspath(extra), os.fspath(image), "-no-progress", "-quiet",
                  "-no-recovery", *rooted], f"adding ocistage files to {image.name}",
                 output=image)


#: the FUSE servers tried, in order: squashfuse's low-level build first (Debian's squashfuse
#: package ships it), which reads a whole image about twice as fast (docs/performance.md)
SQUASHFUSE = ("squashfuse_ll", "squashfuse")


def squashfuse_tools() -> list[str]:
    """The paths of :data:`SQUASHFUSE` that are installed, in order."""
    return [path for path in map(shutil.which, SQUASHFUSE) if path is not None]


#: what ``--mount`` says when it cannot mount, beside what to fix
_OR_UNPACK = "or stage without --mount (the image is unpacked instead)"


def mount_problem() -> tuple[str, str] | None:
    """Why the caller cannot mount an image here (message, hint), or None: squashfuse
    installed, ``/dev/fuse`` open to it, and fusermount for an unprivileged user (``ocistage
    doctor`` says the same)."""
    if not squashfuse_tools():
        return "squashfuse is not installed", f"install squashfuse, {_OR_UNPACK}"
    try:
        device = os.stat("/dev/fuse")
    except OSError:
        return "there is no /dev/fuse", f"as root: modprobe fuse; {_OR_UNPACK}"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return (f"/dev/fuse ({stat.filemode(device.st_mode)}, uid {device.st_uid}) is not open "
                f"to you", f"ask an admin to make it 0666 (as root: chmod 666 /dev/fuse; "
                f"Debian's default), {_OR_UNPACK}")
    if os.geteuid() != 0 and not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return ("there is no fusermount3 or fusermount, which FUSE needs for a user",
                f"install fuse3, {_OR_UNPACK}")
    return None


def can_mount() -> bool:
    """Whether the caller can mount an image here (:func:`mount_problem`)."""
    return mount_problem() is None


def mount(image: Path, mountpoint: Path) -> bool:
    """Mount ``image`` at the empty directory ``mountpoint`` with squashfuse_ll, else
    squashfuse; False if FUSE is not usable here (:func:`can_mount`) or the mount fails."""
    return _mount(image, mountpoint) is None


def _mount(image: Path, mountpoint: Path) -> tuple[str, str] | None:
    """:func:`mount`; None when mounted, else why not (message, hint)."""
    problem = mount_problem()
    if problem is not None:
        return problem
    tools = squashfuse_tools()
    said = ""
    # The container's processes run under other (mapped) uids than the mounting user, so
    # the mount must allow other users; default_permissions makes the kernel check the
    # image's modes and owners as on a directory bundle. An unprivileged user may lack
    # user_allow_other in /etc/fuse.conf: then mount for the user alone. Read-only, as the
    # image is: on a writable FUSE mount every read makes the kernel forget the file's access
    # time, and the next stat of the file (tar's, after reading it) is one more request to the
    # server, a quarter of the round trips of a whole-tree read (docs/performance.md, G8).
    for tool in tools:
        for options in (["-o", "ro,allow_other,default_permissions"], ["-o", "ro"]):
            result = subprocess.run([tool, *options, os.fspath(image), os.fspath(mountpoint)],
                                    capture_output=True, text=True, timeout=60,
                                    stdin=subprocess.DEVNULL, check=False)
            if result.returncode == 0 and os.path.ismount(mountpoint):
                return None
            lines = result.stderr.strip().splitlines()
            said = f"{os.path.basename(tool)}: {lines[-1] if lines else 'failed'}"
    return f"the mount failed ({said[:300]})", f"see `ocistage doctor`, {_OR_UNPACK}"


#: a device node in ``unsquashfs -lln``:
#: ``crw-rw-rw- 0/0  1,  3 2024-01-01 00:00 squashfs-root/dev/null``
_DEVICE_LINE = re.compile(rb"[cb]\S{9} \S+\s+\d+,\s*\d+ \S+ \S+ squashfs-root/(.+)")


def unpack(image: Path, dest: Path, *, rootless: bool = True, limit: int | None = None) -> None:
    """Unpack ``image`` into ``dest`` (must not exist; its parent is private) with unsquashfs.

    ``rootless`` (the default, as for layers, :func:`ocistage.bundler.unpack.apply.apply_layer`):
    an image is
    hostile until proven otherwise, so no device node is created (they are left out), no file
    keeps a setuid or setgid bit, and only ``user.*`` xattrs are extracted (no file
    capabilities). ``rootless=False`` unpacks everything as it is, and only for root.

    Before anything is written, the listing is held to the unpack budget as layers are
    (:mod:`ocistage.cache.unpackbudget`; ``limit`` [default: from the image's size]): the files'
    sizes plus a charge per entry, so a bomb of data or of empty files is refused (LayerError).
    """
    unsquashfs = _tool("unsquashfs")
    if limit is None:
        limit = default_unpack_limit(os.path.getsize(image))
    devices = _listing(unsquashfs, image, UnpackBudget(limit))
    if not rootless and os.geteuid() == 0:
        run_tool([unsquashfs, "-d", os.fspath(dest), "-no-progress", os.fspath(image)],
                 f"unsquashfs of {image.name}", output=dest)
        return
    excluded = dest.parent / f"{dest.name}.devices"
    with open(excluded, "wb") as out:
        out.writelines(name + b"\n" for name in devices)
    try:
        run_tool([unsquashfs, "-d", os.fspath(dest), "-no-progress", "-user-xattrs",
                  "-no-wildcards", "-exclude-file", os.fspath(excluded), os.fspath(image)],
                 f"unsquashfs of {image.name}", output=dest)
    finally:
        os.unlink(excluded)
    strip_privileges(dest, devices=True)  # any the listing missed, and set-id bits


def _listing(unsquashfs: str, image: Path, budget: UnpackBudget) -> list[bytes]:
    """Paths of the device nodes in ``image``, from its listing (streamed), which is charged
    to ``budget`` entry by entry (LayerError, and unsquashfs stopped, when it runs out)."""
    found = []
    try:
        with subprocess.Popen([unsquashfs, "-lln", os.fspath(image)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as listing:
            assert listing.stdout is not None
            try:
                for line in listing.stdout:
                    budget.charge(ENTRY_CHARGE + _file_size(line))
                    device = _DEVICE_LINE.fullmatch(line.rstrip(b"\n"))
                    if device is not None:
                        found.append(device[1])
            except BaseException:
                listing.kill()
                raise
    except OSError as exc:
        raise StageError(f"listing {image.name} failed: {exc}") from exc
    if listing.returncode != 0:
        raise StageError(f"listing {image.name} failed: unsquashfs exited with "
                         f"{listing.returncode}")
    return found


def _file_size(line: bytes) -> int:
    """The size of a regular file's line of ``unsquashfs -lln`` (``-rw-r--r-- 0/0 1234 ...``),
    0 for anything else."""
    if not line.startswith(b"-"):
        return 0
    fields = line.split(None, 3)
    return int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 0


def _readonly_config_file(source: Path, extra: Path) -> None:
    config = source / "config.json"
    if not config.is_file() or config.is_symlink():
        return
    data = readonly_config(config.read_bytes())
    if data is not None:
        (extra / "config.json").write_bytes(data)


def stage_squashfs(staging: Staging, source: Path, label: str, *,
                   mount_image: bool | None = None, jobs: int = 8,
                   progress: ImageProgress | None = None) -> StageResult:
    """The squashfs strategy: build ``NAME.sqfs`` from ``source`` in a scratch dir and
    install it (:func:`install_image`) at ``staging.final``."""
    staging.refuse_foreign("squashfs")
    entries = scan(source)
    files = sum(1 for e in entries if e.type == "file")
    previous = staging.previous()
    if staging.marker is not None and previous is not None and unchanged(entries, previous):
        return staging.unchanged(files, staging.marker.method)
    entries, _ = fill_hashes(source, entries, previous, jobs)
    scratch = staging.scratch()
    method = "squashfs-mount" if mount_image is not False else "squashfs-unpack"
    image = image_path(staging.final)
    built = make_image(source, entries, scratch, image.name,
                       staging.new_marker(label, method, "squashfs", image.name), jobs,
                       progress, private=True)
    method = install_image(staging, built, label, mount_image)
    return StageResult(staging.final, files, files, 0, 0, tree_size(entries),
                       staging.lease.id, method)


def tree_size(entries: list[Entry]) -> int:
    """The bytes of the regular files of a tree: what a squashfs staging reports as copied,
    as a first directory staging does (not the compressed image's size)."""
    return sum(e.size for e in entries if e.type == "file")


def make_image(source: Path, entries: list[Entry], scratch: Path, image_name: str,
               marker: Marker, jobs: int = 8, progress: ImageProgress | None = None, *,
               private: bool = False) -> Path:
    """Build ``scratch/image_name`` from ``source`` with its manifest (``entries`` with hashes),
    ``marker`` and a read-only-root ``config.json``; returns its path. ``private``: the
    image's root directory is owner-only (an image mounted here, docs/trust.md rule 3)."""
    extra = scratch / "extra"
    extra.mkdir()
    _readonly_config_file(source, extra)
    manifest = Manifest(tuple(entries), method="squashfs", readonly_root=True)
    write_private(extra / MANIFEST_NAME, manifest.chunks())
    (extra / MARKER_NAME).write_bytes(marker.to_json())
    built = scratch / image_name
    build_image(source, built, extra, jobs=min(jobs, usable_cpus()), progress=progress,
                root_mode=PRIVATE_DIR_MODE if private else None)
    return built


def install_image(staging: Staging, built: Path, label: str,
                  mount_image: bool | None) -> str:
    """Move the image ``built`` (in a scratch dir of ``staging``) to ``NAME.sqfs`` and mount
    or unpack it at ``NAME``; returns the method (squashfs-mount or squashfs-unpack).

    Where the image cannot be mounted (no FUSE for the caller: an ordinary user here), it is
    unpacked from the scratch dir and moved to ``NAME.sqfs`` only once ``NAME`` is published;
    an image put there to mount and then unpacked is taken away again if the unpack fails.
    So a failed or killed stage leaves no ``NAME.sqfs`` without a ``NAME/`` (the endurance
    test found 32 MiB of such images after every stage had been unstaged) and no unmarked
    empty ``NAME/``."""
    final = staging.final
    image = image_path(final)
    _take_down(final)
    placed = mount_image is True or (mount_image is None and can_mount())
    problem: tuple[str, str] | None = None
    if placed:
        os.rename(built, image)
        made = not os.path.isdir(final)
        if made:  # the mount point, made only to mount on
            os.mkdir(final, PRIVATE_DIR_MODE)
        problem = _mount(image, final)
        if problem is None:
            return "squashfs-mount"
        if made:  # an empty NAME/ without a marker would be no stage unstage could remove
            with contextlib.suppress(OSError):
                os.rmdir(final)
    try:
        if mount_image is True:
            message, hint = problem or ("FUSE is not usable here", _OR_UNPACK)
            raise StageError(f"cannot mount {image}: {message}", hint)
        unpacked = built.parent / "bundle"
        unpack(image if placed else built, unpacked)
        # the marker inside the image says how it was meant to be used; record what was done
        with contextlib.suppress(FileNotFoundError):
            os.unlink(unpacked / MARKER_NAME)
        marker = staging.new_marker(label, "squashfs-unpack", "squashfs", image.name)
        (unpacked / MARKER_NAME).write_bytes(marker.to_json())
        staging.publish(unpacked)
    except BaseException:
        if placed:
            with contextlib.suppress(OSError):
                os.unlink(image)
        raise
    if not placed:
        os.rename(built, image)
    return "squashfs-unpack"


def _take_down(final: Path) -> None:
    """Unmount a previous image at ``final`` (an unpacked previous version stays until the new
    one replaces it). An image in use (a running job's container) is detached lazily: the job
    goes on reading the image it started with, as with a retired directory version
    (:mod:`ocistage.stagers.retired`), and the image's file, replaced by the new one, goes when the
    last reader is done."""
    if os.path.ismount(final):
        try:
            unmount(final)
        except StoreError:  # busy
            unmount(final, lazy=True)
