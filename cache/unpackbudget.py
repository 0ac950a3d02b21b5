"""The unpack budget: how much one bundle (or unpacked squashfs image) may write.

Shared by the layer applier (``ocistage.bundler.unpack.apply``) and the squashfs unpacker
(``ocistage.stagers.squashfs``): file data written counts (holes are free), and so does every entry
(file, directory, link, whiteout), at :data:`ENTRY_CHARGE`: a flood of empty files writes no
data but fills the filesystem's inodes. A decompression bomb stops at the limit with a
:class:`ocistage.errors.LayerError`.
"""

from __future__ import annotations

from ocistage.cache.sizes import format_size
from ocistage.errors import LayerError

UNPACK_FLOOR = 4 << 30  # the default unpack budget is the larger of this
UNPACK_RATIO = 100      # and this many times the compressed size of the layers
#: what each entry (file, directory, link, whiteout ...) costs the budget besides its data:
#: an inode and a directory entry. A flood of empty files writes no data but fills the
#: filesystem's inodes, and a 512-byte tar header of one gzips to ~10 bytes; at 1 KiB an
#: entry, 4 GiB is 4M entries (real images have up to a few 100k).
ENTRY_CHARGE = 1024


def default_unpack_limit(compressed: int) -> int:
    """The default unpacked-bytes budget of a bundle whose layers total ``compressed`` bytes.

    Real layers expand 2-10x (gzip and zstd of binaries, text, libraries); only long runs of
    one byte expand ~1000x, and those are what bombs are made of. 100x the compressed size,
    and at least 4 GiB for images of a few small layers, leaves real images far inside it.
    """
    return max(UNPACK_FLOOR, UNPACK_RATIO * compressed)


class UnpackBudget:
    """Bytes of file data a bundle may write, shared by all of its layers (holes are free),
    plus :data:`ENTRY_CHARGE` for each entry."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def charge(self, n: int) -> None:
        self.used += n
        if self.used > self.limit:
            raise LayerError(
                f"the image unpacks to more than {format_size(self.limit)} of file data and "
                f"entries (each counts {format_size(ENTRY_CHARGE)}), its unpack limit (a "
                f"decompression bomb?)",
                "if the image is genuine, raise the limit: unpack_limit in the config file "
                "or $OCISTAGE_UNPACK_LIMIT (e.g. 200G)")
