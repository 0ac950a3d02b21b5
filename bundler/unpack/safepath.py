"""Resolve paths inside a root directory without ever leaving it.

Every lookup walks one component at a time from a directory file descriptor with
``O_PATH | O_DIRECTORY | O_NOFOLLOW``; nothing is ever looked up by a full host path. A symlink met
as a *parent* component is resolved the way a ``chroot`` into the root would resolve it: an
absolute target restarts from the root, ``..`` never climbs above the root, and at most
:data:`MAX_SYMLINK_HOPS` links are followed. The final component of a path is never followed: the
caller operates on it with ``dir_fd`` + basename and ``follow_symlinks=False`` / ``O_NOFOLLOW``.

Names are normalised lexically (:func:`normalize`): leading ``/`` and ``./`` are stripped, empty
and ``.`` components dropped, and ``..`` pops the previous component but is clamped at the root,
as ``filepath.Clean("/" + name)`` does in umoci and Docker. ``/../x``, ``../x`` and ``a/../../x``
all name ``x`` inside the root.

Directory descriptors are cached (LRU) by their resolved path, so consecutive entries of a layer
in the same directory cost no lookups. A descriptor returned by :meth:`SafeRoot.resolve_dir` stays
open until the next call of ``resolve_dir`` or :meth:`SafeRoot.close`; callers that need two at
once ``os.dup`` the first. :meth:`SafeRoot.invalidate` must be called after removing or replacing
a directory or a symlink, because cached resolutions may have passed through it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from ocistage.cache.dirfds import DIR_PATH, DIR_READ
from ocistage.errors import LayerError

MAX_SYMLINK_HOPS = 40
"""Symlinks followed while resolving one path, as Linux's ``MAXSYMLINKS``."""

Parts = tuple[str, ...]


def normalize(name: str) -> Parts:
    """Split an archive member name into components, with ``..`` clamped at the root."""
    if "\x00" in name:
        raise LayerError(f"entry name {name!r} contains a NUL byte",
                         "the layer is corrupt or hostile; rebuild the image")
    split = name.split("/")
    if "" not in split and "." not in split and ".." not in split:
        return tuple(split)  # already clean (most names): three scans in C, no loop
    parts: list[str] = []
    for component in split:
        if component in ("", "."):
            continue
        if component == "..":
            if parts:
                parts.pop()
            continue
        parts.append(component)
    return tuple(parts)


def join_link(base: Parts, target: str) -> Parts:
    """Where a symlink with ``target`` inside directory ``base`` points, chroot-style."""
    start = () if target.startswith("/") else base
    return normalize("/".join((*start, target)))


def display(parts: Parts) -> str:
    return "/" + "/".join(parts)


class SafeRoot:
    """A root directory and a cache of directory descriptors resolved inside it."""

    def __init__(self, root: Path, cache_size: int = 128) -> None:
        self.root = root
        self.root_fd = os.open(root, DIR_PATH & ~os.O_NOFOLLOW)
        self._cache: OrderedDict[Parts, int] = OrderedDict()
        self._cache_size = max(cache_size, 4)
        self._closing: list[int] = []
        self._last: Parts | None = None  # the last key resolve_dir returned: the newest

    def __enter__(self) -> SafeRoot:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.invalidate()
        self._flush()
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1

    def invalidate(self) -> None:
        """Forget every cached descriptor (closed at the next ``resolve_dir``)."""
        self._closing.extend(self._cache.values())
        self._cache.clear()
        self._last = None

    def _flush(self) -> None:
        for fd in self._closing:
            os.close(fd)
        self._closing.clear()
        while len(self._cache) > self._cache_size:
            _, fd = self._cache.popitem(last=False)
            os.close(fd)

    def resolve_dir(self, parts: Parts, *, create: bool = False, follow: bool = True,
                    on_create: Callable[[Parts], None] | None = None) -> tuple[int, Parts] | None:
        """Open the directory ``parts`` inside the root; return ``(O_PATH fd, resolved parts)``.

        Missing components are created (mode 0755) when ``create`` is true, and reported to
        ``on_create``; otherwise ``None`` is returned. With ``follow`` false any symlink on
        the way also yields ``None``. A component that exists but is not a directory (nor a
        symlink resolving to one) yields ``None``, or :class:`LayerError` when creating.
        """
        if parts == self._last and not self._closing:
            return self._cache[parts], parts  # the most recent lookup again: already last
        self._flush()
        cached = self._cache.get(parts)
        if cached is not None:
            self._cache.move_to_end(parts)
            self._last = parts
            return cached, parts
        found = self._walk(parts, create, follow, on_create)
        # the root is never cached: () is not a last lookup
        self._last = parts if parts and found is not None and found[1] == parts else None
        return found

    def _walk(self, parts: Parts, create: bool, follow: bool,
              on_create: Callable[[Parts], None] | None) -> tuple[int, Parts] | None:
        """:meth:`resolve_dir` for a path not in the cache: one component at a time."""
        todo = list(parts)
        todo.reverse()
        resolved: Parts = ()
        fd = self.root_fd
        hops = 0
        while todo:
            name = todo.pop()
            key = (*resolved, name)
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                resolved, fd = key, hit
                continue
            try:
                next_fd = os.open(name, DIR_PATH, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return None
                os.mkdir(name, 0o755, dir_fd=fd)
                if on_create is not None:
                    on_create(key)
                next_fd = os.open(name, DIR_PATH, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(info.st_mode):
                    if create:
                        raise LayerError(
                            f"{display(key)} is not a directory, but the layer puts entries "
                            f"under it", "the image's layers are inconsistent") from exc
                    return None
                if not follow:
                    return None
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise LayerError(f"too many levels of symbolic links resolving "
                                     f"{display(parts)}", "the image has a symlink loop") from exc
                target = join_link(resolved, os.readlink(name, dir_fd=fd))
                todo.extend(reversed(target))
                resolved, fd = (), self.root_fd
                continue
            self._cache[key] = next_fd
            resolved, fd = key, next_fd
        return fd, resolved


def open_readable_dir(dir_fd: int) -> int:
    """A readable descriptor for the directory behind an ``O_PATH`` descriptor."""
    return os.open(".", DIR_READ, dir_fd=dir_fd)
