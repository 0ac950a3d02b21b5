"""A squashfs compression as a setting names it (``zstd:6``, ``zstd:3``, ``lz4``): the
mksquashfs compressor, its level, and the options that ask mksquashfs for them.

A level is given for the compressors whose level mksquashfs takes as
``-Xcompression-level`` (zstd 1-22, gzip 1-9); the others (lz4, lzo, xz) take none here. The
text is checked against these names and ranges before it reaches an argv: nothing of it is
passed on that is not a known compressor or a number in range. Imports nothing heavy (the
settings check a config file's value with it).
"""

from __future__ import annotations

from dataclasses import dataclass

#: compressor -> the levels mksquashfs 4.5 takes for it (None: no level option here)
LEVELS: dict[str, range | None] = {
    "zstd": range(1, 23), "gzip": range(1, 10), "lz4": None, "lzo": None, "xz": None}

#: what a setting must be, said in its error and in docs/config.md
DESCRIBED = ('a squashfs compressor, with a level for zstd (1-22) and gzip (1-9): "zstd:6", '
             '"zstd:3", "lz4", "gzip:9"')


@dataclass(frozen=True)
class Compression:
    """A compressor and its level (None: the compressor's own default)."""

    compressor: str
    level: int | None = None

    @classmethod
    def parse(cls, text: str) -> Compression | None:
        """``COMPRESSOR[:LEVEL]`` as a setting gives it; None if it names no compression of
        :data:`LEVELS` (an unknown compressor, a level out of range or where none is taken)."""
        name, sep, level = text.partition(":")
        if name not in LEVELS:
            return None
        if not sep:
            return cls(name)
        levels = LEVELS[name]
        if levels is None or not level.isascii() or not level.isdigit():
            return None
        number = int(level)
        return cls(name, number) if number in levels else None

    def options(self) -> list[str]:
        """The mksquashfs options of this compression."""
        level = [] if self.level is None else ["-Xcompression-level", str(self.level)]
        return ["-comp", self.compressor, *level]

    def __str__(self) -> str:
        return self.compressor if self.level is None else f"{self.compressor}:{self.level}"
