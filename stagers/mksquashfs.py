"""What this host's ``mksquashfs`` offers: the compressors its help lists.

``mksquashfs -help`` lists them under ``Compressors available:`` (4.4 and later); older
releases do not know ``-help`` and print the same usage text, with the same list, as the
error for it. Both ``stage --format squashfs`` (zstd) and ``ocistage-pyxis-importer`` (zstd,
else gzip) depend on the list, and ``ocistage doctor`` reports it. Imports nothing heavy.
"""

from __future__ import annotations

import re
import subprocess

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
