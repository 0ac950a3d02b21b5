"""Scratch directories with an owner file: made, released once renamed into place, dropped.

Beside scratch directory ``NAME`` lies ``NAME.owner``, the owner's host and pid as
:class:`ocistage.cache.locks.Owner` JSON, so that the directory of a process that died can be
told from one still being built (the store's ``tmp/``, cache gc).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ocistage.cache.locks import Owner
from ocistage.cache.treeremoval import remove_tree

#: the suffix of the owner file beside a scratch directory
OWNER_SUFFIX = ".owner"


def owner_file(directory: Path) -> Path:
    """The owner file beside the scratch directory ``directory``."""
    return directory.parent / f"{directory.name}{OWNER_SUFFIX}"


def make_owned_dir(directory: Path, mode: int = 0o700) -> Path:
    """Create scratch ``directory`` and, beside it, its owner file (this host and pid), so
    that the directory of a process that died can be told from one still being built."""
    owner = Owner.me()
    owner_file(directory).write_text(owner.to_json())
    try:
        directory.mkdir(mode=mode)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            owner_file(directory).unlink()
        raise
    return directory


def release_owned_dir(directory: Path) -> None:
    """Forget the owner file of ``directory`` once the directory was renamed into place."""
    with contextlib.suppress(FileNotFoundError):
        owner_file(directory).unlink()


def drop_owned_dir(directory: Path) -> None:
    """Remove scratch ``directory`` (through descriptors) and then its owner file."""
    remove_tree(directory)
    release_owned_dir(directory)
