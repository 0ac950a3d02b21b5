"""Writing to file descriptors: ``os.write`` may write less than it was given."""

from __future__ import annotations

import os


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, however many ``write`` calls it takes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
