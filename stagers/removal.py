"""Removing the previous version of a staged tree after the switch, with forked workers.

A re-stage publishes a complete new version and then removes the old one: one ``unlink`` per
file (20k files: ~0.07 s on tmpfs in one process). The removal is done through descriptors by
:mod:`ocistage.cache.treeremoval` (no symlink is ever followed, also not one swapped in
meanwhile); here the tree is split into disjoint subtrees, each removed by
``ocistage.cache.treeremoval.remove_at`` relative to the descriptor of its parent, in one
forked worker per CPU (as the build in :mod:`ocistage.stagers.parallel`). What is left — files
near the top and the emptied directories — is removed by ``remove_opened`` of the root, which
checks that the name still is that directory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ocistage.cache.dirfds import open_dir, open_parent
from ocistage.cache.treeremoval import remove_at, remove_opened, remove_tree
from ocistage.stagers.parallel import map_parts

#: subtrees to split into per worker process (contiguous batches of about equal count)
SPLIT_PER_PROCESS = 16
MAX_DEPTH = 4


def remove_in_workers(path: str | os.PathLike[str], processes: int) -> None:
    """:func:`ocistage.cache.treeremoval.remove_tree` of ``path``, its subtrees removed in
    ``processes`` forked workers. Missing is fine; a symlink at ``path`` is only unlinked."""
    if processes <= 1:
        remove_tree(path)
        return
    parent_fd, name = open_parent(path)
    try:
        try:
            root_fd = open_dir(name, parent_fd)
        except OSError:  # missing, or not a directory: nothing to split
            remove_at(parent_fd, name)
            return
        opened = [root_fd]
        try:
            subtrees = split(root_fd, processes * SPLIT_PER_PROCESS, opened)
            map_parts(_remove_part, subtrees, processes)
            remove_opened(parent_fd, name, root_fd)
        finally:
            for fd in opened:
                os.close(fd)
    finally:
        os.close(parent_fd)


def remove_subtrees(root_fd: int, processes: int) -> None:
    """Remove the subdirectories of the directory ``root_fd`` (down to :data:`MAX_DEPTH`) with
    everything in them, in ``processes`` forked workers: what is left is the directories above
    them, emptied of directories, and the files in those (a staged tree's marker among them,
    for its caller to remove last)."""
    opened: list[int] = []
    try:
        subtrees = split(root_fd, processes * SPLIT_PER_PROCESS, opened)
        map_parts(_remove_part, subtrees, processes)
    finally:
        for fd in opened:
            os.close(fd)


def split(root_fd: int, want: int, opened: list[int]) -> list[tuple[int, str]]:
    """Disjoint subtrees of the directory ``root_fd`` as (parent descriptor, name): the
    directories of the first level (up to :data:`MAX_DEPTH`) that has at least ``want`` of
    them. Descriptors of the levels above are opened here and appended to ``opened``."""
    level = [root_fd]
    subtrees: list[tuple[int, str]] = []
    for _depth in range(MAX_DEPTH):
        deeper: list[tuple[int, str]] = []
        for fd in level:
            with os.scandir(fd) as listing:
                deeper.extend((fd, e.name) for e in listing if e.is_dir(follow_symlinks=False))
        if len(deeper) <= len(subtrees):  # no finer split below: keep the level above
            break
        subtrees = deeper
        if len(subtrees) >= want:
            break
        level = []
        for fd, name in subtrees:
            try:
                child = open_dir(name, fd)
            except OSError:  # swapped or gone meanwhile: the final removal deals with it
                continue
            opened.append(child)
            level.append(child)
    return subtrees


def _remove_part(part: Sequence[tuple[int, str]]) -> list[None]:
    for parent_fd, name in part:
        remove_at(parent_fd, name)
    return [None] * len(part)
