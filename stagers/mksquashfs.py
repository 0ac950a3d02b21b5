"""What this host's ``mksquashfs`` offers, how a name reaches it safely, and the one way
mksquashfs and unsquashfs are run (:func:`run_tool`).

``mksquashfs -help`` lists the compressors under ``Compressors available:`` (4.4 and later);
older releases do not know ``-help`` and print the same usage text, with the same list, as the
error for it. Both ``stage --format squashfs`` (zstd) and ``ocistage-pyxis-importer`` (zstd,
else gzip) depend on the list, and ``ocistage doctor`` reports it.

Pseudo definitions (``-p "NAME TYPE ..."``) are a little language: mksquashfs splits a
definition at white space, honours ``"..."`` and backslash escapes in NAME, and type ``f`` runs
the rest of the definition with ``/bin/sh -c``. A name from an image (a WorkingDir, a mount
destination) must therefore never reach a definition as it is: :func:`pseudo_name` escapes every
byte of it, which mksquashfs 4.5 reads back as that byte (white space, quotes, ``#``, newlines
included; tests/stagers/test_mksquashfs_names.py holds it against the real mksquashfs), and
refuses what no definition can carry.

:func:`run_tool` runs both tools for ``stage --format squashfs`` and ``ocistage-pyxis-importer``:
under :func:`ocistage.cache.childguard.spawn` (a SIGKILLed ocistage leaves no tool writing into
its scratch directory), killed and reaped when the caller is interrupted, its stdout and
stderr read apart in chunks (mksquashfs's progress bar reported, the last lines kept for the
error), within a time limit. Imports nothing heavy.
"""

from __future__ import annotations

import errno
import os
import re
import selectors
import subprocess
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from ocistage.cache import childguard
from ocistage.stagers.errors import PseudoNameError, ToolFailed

#: the longest name of one directory entry Linux looks up (NAME_MAX; squashfs holds 256)
NAME_MAX = 255

#: the block size of every image ocistage builds (``stage --format squashfs`` and the pyxis
#: importer), given rather than left to mksquashfs's default: reading a small file
#: decompresses its whole fragment block, and 128 KiB halved a parallel read of 100k small
#: files against 1 MiB in the published measurement; 1 MiB saved 6-10% of an image's size,
#: and this repository's runs, on a loaded machine, showed no read difference beyond their
#: noise (docs/squashfs-parameters.md). Readers take it from the superblock: images of
#: another block size stay valid.
BLOCK_SIZE = "128K"

_COMPRESSOR_LINE = re.compile(r"\s+([a-z0-9]+)(?: \(default\))?")


def compressors_listed(help_text: str) -> list[str]:
    """The names under ``Compressors available:`` in mksquashfs's help."""
    found: list[str] = []
    listing = False
    for line in help_text.splitlines():
        if line.strip().startswith("Compressors available"):
            if found:
                break
            listing = True
            continue
        if listing:
            match = _COMPRESSOR_LINE.fullmatch(line)
            if match is None:
                if found:
                    break
                continue
            found.append(match.group(1))
    return found


def help_text(mksquashfs: str, timeout: float = 60) -> str:
    """What ``mksquashfs -help`` prints, on stdout and stderr, whatever its exit status (an
    older mksquashfs prints its usage as the error for an unknown ``-help``). Raises
    ``OSError`` or ``subprocess.SubprocessError`` when it cannot be run."""
    result = subprocess.run([mksquashfs, "-help"], capture_output=True, text=True,
                            timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    return result.stdout + result.stderr


def pseudo_name(parts: Sequence[str]) -> str:
    """The NAME field of a pseudo definition for the path ``parts`` (its components, below the
    image's root): every byte escaped with a backslash, components joined by ``/``.

    Raises :class:`PseudoNameError` for a component that is empty, ``.``, ``..``, holds ``/`` or
    a NUL byte, has a character with no byte form (a lone surrogate) or is longer than
    :data:`NAME_MAX` bytes. Non-UTF-8 bytes, carried as ``surrogateescape`` (os.fsdecode),
    come out as those bytes.
    """
    if not parts:
        raise PseudoNameError("a pseudo definition needs a name below the image's root")
    escaped = [_escaped(part) for part in parts]
    return os.fsdecode(b"/".join(escaped))


def _escaped(part: str) -> bytes:
    try:
        raw = os.fsencode(part)
    except UnicodeEncodeError as exc:
        raise PseudoNameError(f"the name {part!r} has a character with no byte form") from exc
    if raw in (b"", b".", b"..") or b"/" in raw or b"\0" in raw:
        raise PseudoNameError(f"{part!r} is no name a squashfs image can hold")
    if len(raw) > NAME_MAX:
        raise PseudoNameError(f"the name {part[:40]!r}... is {len(raw)} bytes long, longer "
                              f"than the {NAME_MAX} a squashfs image holds")
    return b"".join(b"\\" + raw[i:i + 1] for i in range(len(raw)))


def pseudo_dir(parts: Sequence[str], mode: int, uid: int, gid: int) -> str:
    """A pseudo definition making the directory ``parts`` (see :func:`pseudo_name`)."""
    return f"{pseudo_name(parts)} d {mode:o} {uid} {gid}"


def pseudo_file(parts: Sequence[str], mode: int, uid: int, gid: int, command: str) -> str:
    """A pseudo definition making the file ``parts`` from what ``command`` prints: ``command``
    is run by ``/bin/sh -c`` and must be the caller's own text, quoted by it."""
    return f"{pseudo_name(parts)} f {mode:o} {uid} {gid} {command}"


#: how long one mksquashfs or unsquashfs may take
TOOL_TIMEOUT = 3600.0
#: called with (files done, files in all) while mksquashfs builds an image
ImageProgress = Callable[[int, int], None]
#: mksquashfs's progress bar, rewritten in place with \r: ``[====/    ] 120/300  40%``
_BAR = re.compile(rb"\]\s+(\d+)/(\d+)\s+\d+%")


def run_tool(argv: Sequence[str], what: str, *, progress: ImageProgress | None = None,
             timeout: float = TOOL_TIMEOUT, output: Path | None = None) -> None:
    """Run ``argv`` (mksquashfs or unsquashfs; stdin closed, stdout and stderr read apart) to
    its end. Raises :class:`ToolFailed` ("WHAT failed: DETAIL") when it cannot be started,
    exits with a status other than 0 or outlives ``timeout``; killed and reaped when this
    process is interrupted (and by its supervisor if this process is killed).

    DETAIL is its last ``FATAL ERROR`` line, else the last line of its stderr, else of its
    stdout: the tools write errors unbuffered to stderr and the rest buffered to stdout, which
    a pipe flushes at exit, so a mksquashfs appending to an image prints a dozen lines about
    the image after its error. ``progress`` is told how far a mksquashfs that draws its bar
    is. ``output``: where it writes; a failure there with that filesystem full says so
    (mksquashfs 4.5 says only "Failed to write to output filesystem")."""
    try:
        process = childguard.spawn(list(argv), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        raise ToolFailed(f"{what} failed: cannot run {argv[0]}: {exc.strerror}") from exc
    said: deque[bytes] = deque(maxlen=8)  # its last lines besides the bar, both streams
    errors: deque[bytes] = deque(maxlen=32)  # its last lines on stderr
    try:
        timed_out = not _read(process, said, errors, progress, time.monotonic() + timeout)
        if timed_out:
            process.terminate()  # the supervisor kills and reaps the tool, then ends
        process.wait()
    except BaseException:
        if process.poll() is None:
            process.terminate()
            process.wait()
        raise
    finally:
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    lines = tuple(line.decode(errors="replace") for line in said)
    if timed_out:
        raise ToolFailed(f"{what} failed: still running after {timeout:.0f} s", lines)
    if process.returncode != 0:
        complaints = [line.decode(errors="replace") for line in errors]
        detail = _detail(complaints, lines, process.returncode)
        if _out_of_space([*complaints, *lines], output):
            where = f"the filesystem of {output}" if output else "its filesystem"
            raise ToolFailed(f"{what} failed: no space left on {where} ({detail})", lines,
                             process.returncode,
                             "free space there (ocistage cache gc), or stage elsewhere",
                             no_space=True, detail=detail)
        raise ToolFailed(f"{what} failed: {detail}", lines, process.returncode, detail=detail)


def _detail(complaints: Sequence[str], lines: Sequence[str], status: int) -> str:
    """What a failed tool's error says: its last ``FATAL ERROR`` line, else its last line on
    stderr, else on stdout, else its exit status."""
    fatal = [line for line in complaints if line.startswith("FATAL ERROR")]
    for found in (fatal, complaints, lines):
        if found:
            return found[-1]
    return f"exit status {status}"


def _out_of_space(lines: Sequence[str], output: Path | None) -> bool:
    """Whether a failed tool ran out of space: it says so, or it could not write its output
    and the filesystem there has less than a squashfs block left."""
    if any(os.strerror(errno.ENOSPC) in line for line in lines):
        return True
    if output is None or not any("Failed to write" in line for line in lines):
        return False
    try:
        info = os.statvfs(output.parent)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize < (1 << 20)


def _read(process: subprocess.Popen[bytes], said: deque[bytes], errors: deque[bytes],
          progress: ImageProgress | None, deadline: float) -> bool:
    """Read the tool's stdout and stderr until both end (True) or the deadline passes
    (False); lines of stderr go to ``errors`` too."""
    assert process.stdout is not None and process.stderr is not None
    pending = {process.stdout.fileno(): b"", process.stderr.fileno(): b""}
    stderr = process.stderr.fileno()
    with selectors.DefaultSelector() as selector:
        for fd in pending:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for key, _ in selector.select(left):
                fd = int(key.fd)
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    selector.unregister(fd)
                    _said(pending[fd], said, errors if fd == stderr else None, progress)
                    continue
                *parts, rest = re.split(rb"[\r\n]", pending[fd] + chunk)
                pending[fd] = rest[-4096:]  # a bar is short; never hold an endless line
                for part in parts:
                    _said(part, said, errors if fd == stderr else None, progress)
    return True


def _said(part: bytes, said: deque[bytes], errors: deque[bytes] | None,
          progress: ImageProgress | None) -> None:
    bar = _BAR.search(part)
    if bar is not None:
        if progress is not None:
            progress(int(bar[1]), int(bar[2]))
    elif part.strip():
        said.append(part.strip())
        if errors is not None:
            errors.append(part.strip())
