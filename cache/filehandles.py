"""A directory's file handle (``name_to_handle_at(2)``): which directory it is, whatever its path.

Staged places are keyed by it (:func:`ocistage.cache.leases.staged_identity`): it names the inode
and its generation, as NFS servers hand out, so a directory removed and made again is another
place even where it gets the old inode number.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

_AT_EMPTY_PATH = 0x1000
_MAX_HANDLE_SZ = 128


class _FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * _MAX_HANDLE_SZ)]


@functools.cache
def _name_to_handle_at() -> Callable[..., int] | None:
    function = getattr(ctypes.CDLL(None, use_errno=True), "name_to_handle_at", None)
    if function is None:
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_FileHandle),
                         ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    function.restype = ctypes.c_int
    result: Callable[..., int] = function
    return result


def file_handle(fd: int) -> str:
    """The file handle of the opened ``fd`` (``name_to_handle_at(2)``), as
    ``<type>-<hex bytes>``; "" where the filesystem (or libc) has none. It names the inode
    and its generation: a new directory that gets a removed one's inode number gets another
    handle."""
    function = _name_to_handle_at()
    if function is None:
        return ""
    handle = _FileHandle(handle_bytes=_MAX_HANDLE_SZ)
    mount_id = ctypes.c_int()
    if function(fd, b"", ctypes.byref(handle), ctypes.byref(mount_id), _AT_EMPTY_PATH) != 0:
        return ""
    size = min(handle.handle_bytes, _MAX_HANDLE_SZ)
    return f"{handle.handle_type:x}-{bytes(handle.f_handle[:size]).hex()}"
