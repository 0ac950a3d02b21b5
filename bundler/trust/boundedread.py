"""Read a file that someone else may have made: a regular file only, never more than a limit.

The open does not block (``O_NONBLOCK``: a FIFO where a key should be is refused by ``fstat``
instead of waiting for a writer); a symbolic link to a regular file is followed, as
containers/image follows a ``keyPath`` link.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class BoundedReadError(Exception):
    """The file is missing, not a regular file, unreadable or larger than allowed."""


def read_regular(path: Path | str, limit: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise BoundedReadError(exc.strerror or str(exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BoundedReadError("not a regular file")
        if info.st_size > limit:
            raise BoundedReadError(f"larger than {limit} bytes")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(1 << 16, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise BoundedReadError(f"larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise BoundedReadError(exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
