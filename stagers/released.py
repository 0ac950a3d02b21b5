"""Which pool entries a new version of a staged name may have left unused.

A re-stage links each unchanged file from the pool entry of its (content, mode, xattrs) again;
the entries of files that changed or went away may then have no bundle left. The stage hands
their keys to :meth:`ocistage.stagers.pool.Pool.release` (which removes those with a link
count of 1) when it removes the replaced version itself; a remover sweeps the whole pool.
"""

from __future__ import annotations

from ocistage.stagers.filemanifest import Entry, Manifest
from ocistage.stagers.pool import pool_key


def released_keys(previous: Manifest, current: Manifest, before: dict[str, Entry],
                   replaced: list[Entry], unchanged: int) -> set[str]:
    """Pool keys the previous version used for a path that now has other content, or that is
    gone: the only entries the new version may have left unused. ``replaced``: the files of
    the new version not staged unchanged, ``unchanged``: how many were (both from
    :meth:`Builder.build`); ``before``: ``previous.by_path()``. :meth:`Pool.release` then
    removes those no bundle links to any more (a key still used elsewhere, e.g. by a moved
    file, has more links and stays). Costs a look at the replaced files only, unless some
    path of the previous version is gone."""
    keys = set()
    kept = 0  # replaced files whose path was a file before
    for entry in replaced:
        old = before.get(entry.path)
        if old is not None and old.type == "file":
            kept += 1
            if old.hash is not None and (old.hash, old.mode, old.xattrs) != (
                    entry.hash, entry.mode, entry.xattrs):
                keys.add(pool_key(old.hash, old.mode, old.xattrs))
    if sum(1 for e in previous.entries if e.type == "file") != unchanged + kept:
        keys.update(keys_not_kept(previous, current))
    return keys


def keys_not_kept(previous: Manifest, current: Manifest) -> set[str]:
    """Pool keys of the files of ``previous`` that ``current`` has not at the same path with
    the same content and mode."""
    now = {e.path: (e.hash, e.mode, e.xattrs) for e in current.entries if e.type == "file"}
    return {pool_key(e.hash, e.mode, e.xattrs) for e in previous.entries
            if e.type == "file" and e.hash is not None
            and now.get(e.path) != (e.hash, e.mode, e.xattrs)}
