"""The doctor's checks of the places the core commands write: the cache (trust, writable,
room) and the stage target, judged as ``stage`` judges them without making anything."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ocistage.bundler.doctor.probes import existing_ancestor, free_space, user_name
from ocistage.bundler.doctor.report import Check, missing, ok, warn
from ocistage.cache.ancestors import check_path_trusted
from ocistage.cache.dirtrust import trust_problem
from ocistage.cache.sizes import format_size
from ocistage.errors import OcistageError

#: below this much free space a cache or stage target is a warning (one image's bundle)
LOW_SPACE = 2 << 30


def _space(name: str, free: int | None, said: str, *, core: bool) -> Check:
    if free is not None and free < LOW_SPACE:
        other = "--cache" if name == "cache" else "--to"
        return warn(name, f"{said}; only {format_size(free)} free on its filesystem",
                    f"free space there, or choose another ({other})", core=core)
    room = f", {format_size(free)} free" if free is not None else ""
    return ok(name, f"{said}{room}", core=core)


def check_cache(path: Path, st: os.stat_result | None, writable: bool,
                free: int | None, parent: Path | None = None) -> Check:
    """The cache directory: the trust rule of a group-shareable cache (docs/trust.md),
    writable, room. ``st`` None: it does not exist yet, ``parent`` is where it will be made."""
    fix = "use a cache of your own: --cache DIR, $OCISTAGE_CACHE or `cache` in the config file"
    if st is None:
        if not writable:
            return missing("cache", f"{path} does not exist and cannot be made in {parent}",
                           fix, core=True)
        return _space("cache", free, f"{path} (made on first use in {parent})", core=True)
    problem = trust_problem(st, group_shared=True)
    if problem is not None:
        return missing("cache", f"{path} {problem}: ocistage refuses it", fix, core=True)
    if not writable:
        return missing("cache", f"{path} is not writable by you", fix, core=True)
    return _space("cache", free, f"{path} (yours)" if st.st_uid == os.geteuid()
                  else f"{path} (owner {user_name(st.st_uid)})", core=True)


def cache_check(path: Path) -> Check:
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return missing("cache", f"cannot examine {path}: {exc.strerror}",
                       "use a cache of your own (--cache DIR)", core=True)
    place = path if st is not None else existing_ancestor(path)
    return check_cache(path, st, os.access(place, os.W_OK | os.X_OK), free_space(place),
                       None if st is not None else place)


def check_stage_target(target: str | None, origin: str,
                       judge: Callable[[Path], Check]) -> Check:
    """The stage target ``stage`` and ``submit`` use: none, a URL (judged when staging), or a
    directory (``judge``)."""
    if not target:
        return warn("stage_target", "none configured: `stage` needs --to",
                    "pass --to DIR|URL, set $OCISTAGE_STAGE_TO, or put stage_to in the config "
                    "file", core=True)
    if "://" in target:
        return ok("stage_target", f"{target} ({origin}): a URL, reached when staging",
                  core=True)
    return judge(Path(target))


def judge_stage_dir(path: Path) -> Check:
    """A stage target directory as ``stage`` judges it (every directory on the way trusted,
    the target the caller's or root's or a sticky one), without making anything."""
    from ocistage.cache.ancestors import ANCESTOR_HINT

    place = existing_ancestor(path)
    try:
        check_path_trusted(place, "stage target", shared=True)
    except OcistageError as exc:
        return missing("stage_target", exc.message, exc.hint or ANCESTOR_HINT, core=True)
    if not place.is_dir():
        return missing("stage_target", f"{place} is not a directory",
                       "give --to a directory (or stage_to)", core=True)
    if not os.access(place, os.W_OK | os.X_OK):
        return missing("stage_target", f"{place} is not writable by you",
                       "choose a target you can write (--to, stage_to)", core=True)
    said = f"{path}" if place == path else f"{path} (made on first use in {place})"
    return _space("stage_target", free_space(place), said, core=True)
