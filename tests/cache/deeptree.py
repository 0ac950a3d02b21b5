"""Deep and long directory chains, made through descriptors (their paths may exceed
PATH_MAX)."""

from __future__ import annotations

import os
from pathlib import Path


def make_chain(root: Path, depth: int, name_length: int) -> int:
    """A chain of ``depth`` directories of ``name_length``-byte names under ``root``, a
    small file in each, made through descriptors (the paths may exceed PATH_MAX); returns
    how many entries it holds."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(depth):
            name = f"d{level}".ljust(name_length, "x")
            os.mkdir(name, dir_fd=fd)
            file = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
            os.write(file, b"x" * 10)
            os.close(file)
            deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    finally:
        os.close(fd)
    return 2 * depth
