"""The mksquashfs command of an importer image: which mksquashfs and compressor, its argv,
its run and its errors."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ocistage.bundler.errors import PyxisImportError
from ocistage.errors import UsageError
from ocistage.stagers.errors import ToolFailed
from ocistage.stagers.mksquashfs import (
    BLOCK_SIZE,
    compressors_listed,
    help_text,
    pseudo_dir,
    pseudo_file,
    pseudo_name,
    run_tool,
)
from ocistage.stagers.squashfs_compression import DESCRIBED, Compression

MKSQUASHFS_TIMEOUT = 3 * 3600
#: the compressions of images when ``pyxis_compression`` names none, in order of preference
#: (the first this node's mksquashfs offers); enroot's own default (lzo) is missing on RHEL 9.
#: zstd 6: an image costs its blobs and its squashfs, at most twice its compressed size
#: (docs/pyxis.md); at zstd's own default, 3, the squashfs of Debian's Python library came to
#: 1.07 of its gzip layer, at 6 to 0.99 (binaries: 1.04 and 0.98), for about twice
#: mksquashfs's CPU time; mksquashfs's own default, 15, took 25 times as long for an image 5%
#: smaller (docs/history/performance-log.md, "pyxis"). The level is not part of an image's
#: key: images made at another level stay valid, and a new default level rebuilds none.
DEFAULT_COMPRESSIONS = (Compression("zstd", 6), Compression("gzip", 6))


@dataclass(frozen=True)
class Mksquashfs:
    """This node's mksquashfs and the compressor it will write images with."""

    path: str
    compression: Compression

    @property
    def compressor(self) -> str:
        """The compressor's name, part of an image's key (its level is not)."""
        return self.compression.compressor

    @classmethod
    def on_this_node(cls, chosen: Compression | None = None) -> Mksquashfs:
        """This node's mksquashfs with the compression ``chosen`` (the ``pyxis_compression``
        setting, :func:`compression_setting`), else the first of
        :data:`DEFAULT_COMPRESSIONS` it offers."""
        path = mksquashfs_path()
        return cls(path, probe_compression(path, chosen))


def mksquashfs_path() -> str:
    """mksquashfs on PATH, else where distributions put it."""
    path = shutil.which("mksquashfs") or next(
        (p for p in ("/usr/sbin/mksquashfs", "/usr/bin/mksquashfs", "/sbin/mksquashfs")
         if os.access(p, os.X_OK)), None)
    if path is None:
        raise PyxisImportError("mksquashfs is not installed on this node",
                               "install squashfs-tools (the package enroot needs too)")
    return path


def compression_setting(setting: str | None) -> Compression | None:
    """The compression the ``pyxis_compression`` setting names (None: not set). A config
    file's value was checked when it was read; the variable's is checked here, before a get
    pulls anything."""
    if setting is None:
        return None
    chosen = Compression.parse(setting)
    if chosen is None:
        raise UsageError(f"invalid pyxis_compression {setting!r}",
                         f"make it {DESCRIBED} ($OCISTAGE_PYXIS_COMPRESSION or "
                         "`pyxis_compression` in the config file, docs/config.md)")
    return chosen


def probe_compression(mksquashfs: str, chosen: Compression | None = None) -> Compression:
    """``chosen``, if ``mksquashfs -help`` lists its compressor as available; without it
    the first of :data:`DEFAULT_COMPRESSIONS` it lists."""
    wanted = DEFAULT_COMPRESSIONS if chosen is None else (chosen,)
    try:
        text = help_text(mksquashfs)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PyxisImportError(f"cannot run {mksquashfs} -help: {exc}") from exc
    available = compressors_listed(text)
    for compression in wanted:
        if compression.compressor in available:
            return compression
    names = ", ".join(c.compressor for c in wanted)
    raise PyxisImportError(f"{mksquashfs} offers none of {names} "
                           f"(it lists {', '.join(available) or 'no compressor'})",
                           "install a squashfs-tools built with zstd or gzip"
                           if chosen is None else
                           "set pyxis_compression to one of those it lists (docs/config.md)")


def _pseudo_dirs(rootfs: Path, relative: str) -> list[str]:
    """Pseudo definitions for the directories of ``relative`` missing from ``rootfs``; none
    below a component that exists but is no directory (enroot's mkdir would fail there too).
    Every name is escaped (:func:`~ocistage.stagers.mksquashfs.pseudo_name`): an image's
    WorkingDir is data, never a definition of its own (issue 39)."""
    parts = [p for p in relative.split("/") if p and p not in (".", "..")]
    if not parts:
        return []
    pseudo_name(parts)  # refuse what no definition can carry before any path is looked at
    result = []
    for depth in range(1, len(parts) + 1):
        try:
            st = os.lstat(rootfs.joinpath(*parts[:depth]))
        except FileNotFoundError:
            result.append(pseudo_dir(parts[:depth], 0o755, 0, 0))
            continue
        except OSError:
            return result
        if not stat.S_ISDIR(st.st_mode):  # a file, or a link (not followed out of the rootfs)
            return result
    return result


def mksquashfs_argv(mksquashfs: str, rootfs: Path, image: Path, files: Mapping[str, Path],
                    workdir: str, compression: Compression, jobs: int) -> list[str]:
    """The mksquashfs command of an image: ``rootfs`` owned by root (``-all-root``, as enroot
    makes it), without what is under /dev, with ``files`` (path inside -> file) replacing the
    image's own and ``workdir`` made. Raises
    :class:`~ocistage.stagers.errors.PseudoNameError` for a ``workdir`` no image can hold."""
    argv = [mksquashfs, os.fspath(rootfs), os.fspath(image), *compression.options(),
            "-b", BLOCK_SIZE, "-noappend", "-no-progress", "-quiet", "-no-recovery", "-all-root",
            "-processors", str(max(1, jobs))]
    pseudo: list[str] = []
    for inside in sorted(files):
        parent = inside.rpartition("/")[0]
        pseudo += [p for p in _pseudo_dirs(rootfs, parent) if p not in pseudo]
    pseudo += [p for p in _pseudo_dirs(rootfs, workdir) if p not in pseudo]
    pseudo += [pseudo_file(inside.split("/"), 0o644, 0, 0,
                           f"cat {shlex.quote(os.fspath(files[inside]))}")
               for inside in sorted(files)]
    for definition in pseudo:
        argv += ["-p", definition]
    # -e takes the rest of the command line
    argv += ["-wildcards", "-e", "dev/*", *sorted(files)]
    return argv


def run_mksquashfs(argv: Sequence[str], store: Path) -> None:
    """Run mksquashfs (writing into ``store``) as every mksquashfs is run
    (:func:`ocistage.stagers.mksquashfs.run_tool`: killed with this process, however it
    ends); its failure said the importer's way (:func:`mksquashfs_error`)."""
    try:
        run_tool(argv, "mksquashfs", timeout=MKSQUASHFS_TIMEOUT, output=Path(argv[2]))
    except ToolFailed as exc:
        if exc.status is None:
            raise PyxisImportError(exc.message, exc.hint) from exc
        # its lines of both streams, then the one that says what went wrong (run_tool)
        said = exc.said + ((exc.detail,) if exc.detail else ()) + (
            (os.strerror(errno.ENOSPC),) if exc.no_space else ())
        raise mksquashfs_error("\n".join(said), exc.status, store) from exc


def mksquashfs_error(output: str, status: int, store: Path) -> PyxisImportError:
    """The error of a failed mksquashfs: its last line, or that ``store`` is full."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if any(os.strerror(errno.ENOSPC) in line for line in lines):
        return PyxisImportError(f"no space left on the filesystem of {store} for the image",
                                "free space there, or point pyxis_store (docs/pyxis.md) at a "
                                "larger filesystem")
    return PyxisImportError(f"mksquashfs failed: {lines[-1] if lines else f'exit {status}'}",
                            f"check the free space of {store} (docs/pyxis.md)")
