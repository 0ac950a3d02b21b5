"""What this host's ``mksquashfs`` offers, and how a name reaches it safely.

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
refuses what no definition can carry. Imports nothing heavy.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence

from ocistage.stagers.errors import PseudoNameError

#: the longest name of one directory entry Linux looks up (NAME_MAX; squashfs holds 256)
NAME_MAX = 255

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
