"""Sizes (``500M``, ``20G``, ``1.5T``) and ages (``30m``, ``12h``, ``7d``) as users type them,
and counts as people read them (``1 layer``, ``2 layers``).

Size suffixes are powers of 1024, as ``du -h``, ``sort -h`` and Slurm's ``--mem`` read them:
``K``/``KB``/``KiB`` = 1024, ``M`` = 1024², ``G``, ``T``, ``P``; a bare number is bytes.
Age suffixes: ``s``, ``m`` (minutes), ``h``, ``d``, ``w``; a bare number is seconds.
"""

from __future__ import annotations

import math
import re

from ocistage.errors import UsageError

_SIZE_RE = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[kmgtp]?)(?:i?b)?\s*$",
                      re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_AGE_RE = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[smhdw]?)\s*$")
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """Bytes in ``text`` (``0``, ``4096``, ``500M``, ``1.5T``, ``20GiB``); UsageError if not."""
    match = _SIZE_RE.match(text)
    if match is None:
        raise UsageError(f"invalid size {text!r}",
                         "sizes look like 500M, 20G or 1.5T (powers of 1024), or bytes")
    value = float(match.group("number")) * _SIZE_UNITS[match.group("unit").lower()]
    if not math.isfinite(value):
        raise UsageError(f"size {text!r} is too large")
    return int(value)


def parse_age(text: str) -> float:
    """Seconds in ``text`` (``90``, ``30m``, ``12h``, ``7d``, ``2w``); UsageError if not."""
    match = _AGE_RE.match(text)
    if match is None:
        raise UsageError(f"invalid age {text!r}",
                         "ages look like 30m, 12h, 7d or 2w (s, m, h, d, w), or seconds")
    return float(match.group("number")) * _AGE_UNITS[match.group("unit")]


def count(number: int, noun: str, plural: str | None = None) -> str:
    """``1 layer``, ``2 layers``, ``0 blobs``: a number and its noun in English (``plural``
    where it is not NOUN + s: ``count(2, "entry", "entries")``)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def format_size(n: int) -> str:
    """``n`` bytes for humans, in the same powers of 1024 that :func:`parse_size` reads."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def format_age(seconds: float) -> str:
    """A duration for humans, coarsest unit first: ``45s``, ``12m``, ``3h``, ``9d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"
