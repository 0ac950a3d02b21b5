"""Apply one layer (an uncompressed tar stream) onto a rootfs, as image-spec ``layer.md`` says.

The tar is read once, in streaming mode; every entry is written by this module through
:class:`bundler.safepath.SafeRoot` (never ``tarfile.extract``), so nothing outside the rootfs is
ever created, written, linked, chmod-ed, utime-d, xattr-ed or deleted. See ``docs/layers.md``
for the semantics and the deliberate differences from ``umoci unpack --rootless``.

Whiteouts apply to lower layers only, whatever their order in the tar: every path this layer
creates is remembered, and a whiteout (``.wh.NAME``) or opaque marker (``.wh..wh..opq``) removes
only what this layer did not create, keeping directories that lead to entries it created.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import struct
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import BinaryIO, Self, cast

from bundler.safepath import Parts, SafeRoot, display, normalize, open_readable_dir
from cache.errors import LayerError, OcistageError
from cache.fdio import created_exactly, process_umask, write_all
from cache.fsops import DIR_READ, chmod_path_fd, chown_path_fd, remove_at
from cache.unpackbudget import ENTRY_CHARGE, UnpackBudget

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
XATTR_PAX_PREFIX = "SCHILY.xattr."
COPY_CHUNK = 1 << 20
READ_CHUNK = 1 << 20  # what _ForwardReader asks its source for at once

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_XATTR_SKIPPABLE = {errno.EPERM, errno.EACCES, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EINVAL,
                    errno.ERANGE, errno.E2BIG}
_CORRUPT_HINT = ("the layer blob is corrupt or not a tar archive; remove it from the cache "
                 "and pull again")


@dataclass
class ApplyReport:
    """What applying one layer did."""

    entries: int = 0
    bytes_written: int = 0
    warnings: list[str] = field(default_factory=list)


def apply_layer(stream: BinaryIO, rootfs: Path, *, rootless: bool = True,
                budget: UnpackBudget | None = None) -> ApplyReport:
    """Apply the uncompressed tar ``stream`` onto the existing directory ``rootfs``, in place.

    ``rootless``: no ``chown``, device nodes become empty regular files (with a warning), and
    directories keep ``u+rwx`` so the bundle can always be deleted. Otherwise (running as
    root) owners are set and device nodes created as in the image. Sparse files keep their
    holes. ``budget``: file data written counts against it (LayerError when exceeded).
    """
    report = ApplyReport()
    try:
        with SafeRoot(rootfs) as root:
            applier = _Applier(root, rootless, report, budget)
            # "r:" over a forward-only reader: the same parsing as "r|" without its _Stream,
            # which copies its whole buffer on every header read (measured: see
            # docs/performance.md)
            with tarfile.open(fileobj=_ForwardReader(stream), mode="r:",  # type: ignore[call-overload]
                              tarinfo=tarinfo_class()) as archive:
                for member in members(archive):
                    applier.apply(archive, member)
            applier.finish()
    except tarfile.TarError as exc:
        raise LayerError(f"cannot read layer tar: {exc}", _CORRUPT_HINT) from exc
    except OcistageError:
        raise
    except OSError as exc:
        hint = ("free some space on the filesystem of the bundle"
                if exc.errno in (errno.ENOSPC, errno.EDQUOT) else
                "check the permissions and free space of the destination directory")
        raise LayerError(f"cannot apply layer onto {rootfs}: {exc.strerror or exc}", hint) from exc
    return report


class _ForwardReader:
    """A stream with ``tell()`` and forward-only ``seek()``, for tarfile's ``r:`` mode.

    tarfile only seeks forward when reading an archive front to back (to skip unread data
    and padding); a backward seek means the archive is not being read that way and fails.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._buf = b""
        self._pos = 0           # read position in _buf
        self._base = 0          # stream offset of _buf[0]

    def tell(self) -> int:
        return self._base + self._pos

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            parts = [self._buf[self._pos:]]
            while chunk := self._raw.read(READ_CHUNK):
                parts.append(chunk)
            data = b"".join(parts)
            self._base += self._pos + len(data)
            self._buf, self._pos = b"", 0
            return data
        end = self._pos + size
        if end <= len(self._buf):
            data = self._buf[self._pos:end]
            self._pos = end
            return data
        parts = [self._buf[self._pos:]]
        need = end - len(self._buf)
        self._base += len(self._buf)
        self._buf, self._pos = b"", 0
        while need > 0:
            chunk = self._raw.read(max(need, READ_CHUNK))
            if not chunk:
                break
            if len(chunk) > need:
                parts.append(chunk[:need])
                self._buf, self._pos = chunk, need
                break
            parts.append(chunk)
            self._base += len(chunk)
            need -= len(chunk)
        return b"".join(parts)

    def peek_exact(self, size: int) -> bytes:
        """The next ``size`` bytes without consuming them (fewer only at the end)."""
        if len(self._buf) - self._pos < size:
            parts = [self._buf[self._pos:]]
            have = len(parts[0])
            while have < size and (chunk := self._raw.read(max(size - have, READ_CHUNK))):
                parts.append(chunk)
                have += len(chunk)
            self._base += self._pos
            self._buf, self._pos = b"".join(parts), 0
        return self._buf[self._pos:self._pos + size]

    def consume(self, size: int) -> None:
        """Move past ``size`` bytes that :meth:`peek_exact` has just returned."""
        self._pos += size

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            offset += self.tell()
        elif whence != os.SEEK_SET:
            raise OSError(errno.ESPIPE, "a layer stream cannot seek from its end")
        skip = offset - self.tell()
        if skip < 0:
            raise OSError(errno.ESPIPE, "a layer stream cannot seek backwards")
        while skip > 0:
            if self._pos >= len(self._buf):
                self._base += len(self._buf)
                self._buf, self._pos = self._raw.read(READ_CHUNK), 0
                if not self._buf:
                    break  # past the end: the next read returns nothing, as for a file
            take = min(skip, len(self._buf) - self._pos)
            self._pos += take
            skip -= take
        return self.tell()


_HEADER = struct.Struct("100s8s8s8s12s12s8s1s100s8s32s32s8s8s155s")
_NUL_TO_BLANK = bytes.maketrans(b"\0", b" ")
_BLANK8 = b" " * 8  # a device number field of NULs (GNU and Python's tarfile leave them so)
_PAX_FAST_LIMIT = 1 << 16  # larger extended headers go through tarfile's own parser
_PAX_DEFER = (b"hdrcharset", b"GNU.sparse")  # charsets and sparse maps: tarfile's code


class _TarInfo(tarfile.TarInfo):
    """TarInfo with faster header parsers that give exactly tarfile's results.

    tarfile converts every header field with a Python loop (``nts``/``nti``), sums the checksum
    twice and parses PAX records with regular expressions and a fallback decoder per field;
    together most of the time of parsing a layer of small files (measured). The fast paths take
    the common cases (plain octal fields; PAX extended headers of well-formed UTF-8 records)
    and defer everything else to tarfile's own code: base-256 numbers, odd whitespace, GNU
    sparse headers, global headers, ``hdrcharset``, malformed or undecodable records.
    """

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        if len(buf) != tarfile.BLOCKSIZE or buf[156:157] == tarfile.GNUTYPE_SPARSE:
            return super().frombuf(buf, encoding, errors)  # its errors, its sparse handling
        (name, mode, uid, gid, size, mtime, chksum, type_, linkname, _magic, uname, gname,
         devmajor, devminor, prefix) = _HEADER.unpack_from(buf)
        try:
            # int() of bytes accepts what tarfile's nti accepts of plain fields (digits, ASCII
            # blanks around them, "_", "+", "0o") once the NULs are blanks; anything else
            # (base-256, text after a NUL, non-ASCII, an empty field but for the device
            # numbers) raises ValueError, and tarfile decides
            nul = _NUL_TO_BLANK
            checksum = int(chksum.translate(nul), 8)
            major, minor = devmajor.translate(nul), devminor.translate(nul)
            fields = (int(mode.translate(nul), 8), int(uid.translate(nul), 8),
                      int(gid.translate(nul), 8), int(size.translate(nul), 8),
                      int(mtime.translate(nul), 8),
                      0 if major == _BLANK8 else int(major, 8),
                      0 if minor == _BLANK8 else int(minor, 8))
        except ValueError:
            return super().frombuf(buf, encoding, errors)
        unsigned = 256 + _byte_sum(buf) - sum(chksum)
        if checksum != unsigned:
            if buf.count(0) == tarfile.BLOCKSIZE:
                return super().frombuf(buf, encoding, errors)  # raises its "empty header"
            signed = unsigned - 256 * (sum(1 for b in buf[:148] if b > 127)
                                       + sum(1 for b in buf[156:] if b > 127))
            if checksum != signed:
                return super().frombuf(buf, encoding, errors)  # raises its "bad checksum"
        obj = cls()
        obj.mode, obj.uid, obj.gid, obj.size, obj.mtime, obj.devmajor, obj.devminor = fields
        obj.chksum = checksum
        obj.name = name.split(b"\0", 1)[0].decode(encoding, errors)
        obj.type = type_
        obj.linkname = linkname.split(b"\0", 1)[0].decode(encoding, errors)
        obj.uname = uname.split(b"\0", 1)[0].decode(encoding, errors)
        obj.gname = gname.split(b"\0", 1)[0].decode(encoding, errors)
        if type_ == tarfile.AREGTYPE and obj.name.endswith("/"):
            obj.type = tarfile.DIRTYPE
        if obj.type == tarfile.DIRTYPE:
            obj.name = obj.name.rstrip("/")
        if prefix[0] and type_ not in tarfile.GNU_TYPES:
            obj.name = prefix.split(b"\0", 1)[0].decode(encoding, errors) + "/" + obj.name
        return obj

    def _proc_pax(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        """tarfile's ``_proc_pax`` for extended headers of plain UTF-8 records."""
        stream = tarfile_.fileobj
        length = self._block(self.size)  # type: ignore[attr-defined]
        if (self.type not in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE)
                or not isinstance(stream, _ForwardReader) or length > _PAX_FAST_LIMIT
                or "hdrcharset" in tarfile_.pax_headers):
            return super()._proc_pax(tarfile_)  # type: ignore[misc, no-any-return]
        buf = stream.peek_exact(length)
        records = _pax_records(buf)
        if records is None:
            return super()._proc_pax(tarfile_)  # type: ignore[misc, no-any-return]
        stream.seek(len(buf), os.SEEK_CUR)
        pax_headers = dict(tarfile_.pax_headers)
        pax_headers.update(records)
        try:
            member = self.fromtarfile(tarfile_)
        except tarfile.HeaderError as exc:
            raise tarfile.SubsequentHeaderError(str(exc)) from None  # type: ignore[attr-defined]
        member._apply_pax_info(pax_headers, tarfile_.encoding,  # type: ignore[attr-defined]
                               tarfile_.errors)
        member.offset = self.offset
        if "size" in pax_headers:  # the next header's offset follows the real size
            offset = member.offset_data
            if member.isreg() or member.type not in tarfile.SUPPORTED_TYPES:
                offset += member._block(member.size)  # type: ignore[attr-defined]
            tarfile_.offset = offset
        return member


#: entry types whose 512-byte header is the whole entry header (no extended header, GNU long
#: name or sparse map before or after it): :func:`members` reads those itself
_PLAIN_TYPES = frozenset((tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.LNKTYPE, tarfile.SYMTYPE,
                          tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.DIRTYPE, tarfile.FIFOTYPE,
                          tarfile.CONTTYPE))


def members(archive: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members of ``archive``, read front to back as ``archive.next()`` reads them, none
    kept (tarfile keeps every member it reads: memory would grow with the layer).

    With the fast parser over a :class:`_ForwardReader`, a plain header (:data:`_PLAIN_TYPES`)
    where tarfile expects the next one, with no global PAX header in force, is parsed here: the
    member and the archive's next offset come out as ``next()`` makes them, without its
    per-member bookkeeping (four ``tell()`` calls, three dispatching methods, the members
    list). Anything else (extended and GNU headers, the end of the archive, a short or damaged
    header, a member whose data was not read to its end) is left where it is, unread, for
    ``archive.next()``.
    """
    stream = archive.fileobj
    reader = (stream if isinstance(stream, _ForwardReader) and archive.tarinfo is _TarInfo
              else None)  # None: every member through next()
    while True:
        if (reader is not None and archive.firstmember is None  # type: ignore[attr-defined]
                and not archive.pax_headers and archive.offset == reader.tell()):
            member = _plain_member(archive, reader)
            if member is not None:
                yield member
                continue
        found = archive.next()
        archive.members.clear()  # type: ignore[attr-defined]
        if found is None:
            return
        yield found


def _plain_member(archive: tarfile.TarFile, stream: _ForwardReader) -> tarfile.TarInfo | None:
    """The member whose plain header comes next, consumed; None (nothing consumed) if the
    next header is not one :func:`members` reads itself."""
    buf = stream.peek_exact(tarfile.BLOCKSIZE)
    if len(buf) != tarfile.BLOCKSIZE or buf[156:157] not in _PLAIN_TYPES:
        return None
    try:
        member = _TarInfo.frombuf(buf, archive.encoding, archive.errors)
    except tarfile.HeaderError:
        return None  # the end of the archive, or damage: next() reads it again and decides
    stream.consume(tarfile.BLOCKSIZE)
    member.offset = archive.offset
    member.offset_data = data = archive.offset + tarfile.BLOCKSIZE
    # as TarInfo._proc_builtin: a regular file's data (rounded up to whole blocks) follows
    archive.offset = data + member._block(member.size) if member.isreg() else data  # type: ignore[attr-defined]
    return member


_PRIVATE_SHAPES = {  # the tarfile internals _TarInfo calls or overrides, and their parameters
    "_proc_pax": ["self", "tarfile"],
    "_block": ["self", "count"],
    "_apply_pax_info": ["self", "pax_headers", "encoding", "errors"],
    "fromtarfile": ["tarfile"],
}


def fast_parser_usable() -> bool:
    """Whether this Python's tarfile still has the internals :class:`_TarInfo` relies on, in
    the shape it expects, and the fast parser reads a sample archive exactly as tarfile does.

    When not (a future Python renamed or changed them), layers are parsed with the public
    ``tarfile.TarInfo`` alone: slower on layers of many small files, the same trees.
    """
    import inspect

    try:
        for name, parameters in _PRIVATE_SHAPES.items():
            found = list(inspect.signature(getattr(tarfile.TarInfo, name)).parameters)
            if found != parameters:
                return False
        if not issubclass(tarfile.SubsequentHeaderError, tarfile.HeaderError):  # type: ignore[attr-defined]
            return False
        return _sample_members(_TarInfo) == _sample_members(tarfile.TarInfo)
    except Exception:  # any surprise in the internals means: do not use them
        return False


def _sample_members(tarinfo: type[tarfile.TarInfo]) -> list[tuple[object, ...]]:
    """What ``tarinfo`` (through :func:`members`) reads from a small PAX archive: long names,
    decimal mtimes and xattrs in extended headers, and plain ustar headers between them."""
    import io

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for n, name in enumerate(("plain", "d/" + "long" * 40, "x/ünï", "d/", "d/f", "l")):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = n % 3, 1234567890 + n, 0o4755
            if n < 3:
                info.mtime += 0.5
                info.pax_headers = {"SCHILY.xattr.user.k": f"v{n}"}
            info.type = {3: tarfile.DIRTYPE, 5: tarfile.SYMTYPE}.get(n, tarfile.REGTYPE)
            info.linkname = "d/f" if n == 5 else ""
            archive.addfile(info, io.BytesIO(b"x" * info.size))
    buffer.seek(0)
    with tarfile.open(fileobj=_ForwardReader(buffer), mode="r:",  # type: ignore[call-overload]
                      tarinfo=tarinfo) as archive:
        return [(m.name, m.size, m.mtime, m.mode, m.type, m.linkname, m.offset, m.offset_data,
                 dict(m.pax_headers), b"".join(_member_data(archive, m)) if m.isreg() else b"")
                for m in members(archive)]


@functools.cache
def tarinfo_class() -> type[tarfile.TarInfo]:
    """The header parser layers are read with: the fast one, or tarfile's public one."""
    return _TarInfo if fast_parser_usable() else tarfile.TarInfo


def _pax_records(buf: bytes) -> dict[str, str] | None:
    """The records of a PAX extended header, or None when tarfile's parser must decide.

    A record is ``"%d %s=%s\n" % (length, keyword, value)``, length counting the whole record;
    the records are followed by NUL padding. Anything else (including what tarfile would
    silently skip or decode with a fallback charset) returns None.
    """
    if any(marker in buf for marker in _PAX_DEFER):
        return None
    records: dict[str, str] = {}
    pos, end = 0, len(buf)
    while pos < end and buf[pos]:
        space = buf.find(b" ", pos, pos + 21)
        if space <= pos or not buf[pos:space].isdigit():
            return None
        stop = pos + int(buf[pos:space])
        equals = buf.find(b"=", space + 1, stop)
        if stop > end or equals <= space + 1 or buf[stop - 1] != 0x0A:
            return None
        try:
            records[buf[space + 1:equals].decode("utf-8")] = \
                buf[equals + 1:stop - 1].decode("utf-8")
        except UnicodeDecodeError:
            return None
        pos = stop
    if buf.count(0, pos) != end - pos:
        return None  # garbage after the records
    return records


def _byte_sum(block: bytes | bytearray) -> int:
    """``sum(block)`` of a 512-byte header, 4x faster: the low 16 bits of an Adler-32 are
    1 + the byte sum modulo 65521, and each 256-byte half sums to at most 65280."""
    view = memoryview(block)
    return (zlib.adler32(view[:256]) & 0xFFFF) + (zlib.adler32(view[256:]) & 0xFFFF) - 2


@dataclass
class _DirMeta:
    mode: int
    mtime_ns: int
    uid: int
    gid: int


class _Applier:
    """The state of one layer being applied (paths it created, directory metadata to set)."""

    def __init__(self, root: SafeRoot, rootless: bool, report: ApplyReport,
                 budget: UnpackBudget | None = None) -> None:
        self.root = root
        self.rootless = rootless
        self.report = report
        self.budget = budget
        # "a/b/c" of every path this layer made: one str per entry (~100 bytes; a tuple of its
        # components took ~320, 100 MB for a layer of 300k entries)
        self.created: set[str] = set()
        self.created_ancestors: set[Parts] = set()
        self.dirs: dict[Parts, _DirMeta] = {}
        self.saved_mtimes: dict[Parts, tuple[int, int]] = {}
        self.umask = process_umask()

    # -- bookkeeping ---------------------------------------------------------------------------

    def _mark_created(self, path: Parts) -> None:
        self.created.add("/".join(path))
        for depth in range(len(path) - 1, -1, -1):
            ancestor = path[:depth]
            if ancestor in self.created_ancestors:
                break
            self.created_ancestors.add(ancestor)

    def _implicit_dir(self, path: Parts) -> None:
        """A missing parent was created: earlier records for this path are stale."""
        self._mark_created(path)
        self.dirs.pop(path, None)
        self.saved_mtimes.pop(path, None)

    def _save_mtime(self, parent: Parts, parent_fd: int) -> None:
        """Remember a lower directory's times before this layer changes its entries."""
        if parent in self.saved_mtimes or "/".join(parent) in self.created:
            return
        info = os.stat(parent_fd)
        self.saved_mtimes[parent] = (info.st_atime_ns, info.st_mtime_ns)

    def _warn(self, message: str) -> None:
        self.report.warnings.append(message)

    def _parent(self, parts: Parts) -> tuple[int, Parts]:
        found = self.root.resolve_dir(parts[:-1], create=True, on_create=self._implicit_dir)
        assert found is not None  # create=True either returns or raises
        return found

    def _clear(self, parent_fd: int, name: str) -> None:
        """Remove whatever is at ``name`` so that another type can take its place."""
        try:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        remove_at(parent_fd, name)
        if stat.S_ISDIR(info.st_mode) or stat.S_ISLNK(info.st_mode):
            self.root.invalidate()

    # -- entries -------------------------------------------------------------------------------

    def apply(self, archive: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        self.report.entries += 1
        if self.budget is not None:
            self.budget.charge(ENTRY_CHARGE)
        parts = normalize(member.name)
        if not parts:
            if member.isdir():
                self.dirs[()] = self._dir_meta(member)
            else:
                self._warn(f"skipped non-directory entry {member.name!r} for the root")
            return
        base = parts[-1]
        if base.startswith(WHITEOUT_PREFIX):
            self._whiteout(parts)
            return
        parent_fd, parent = self._parent(parts)
        path = (*parent, base)
        self._save_mtime(parent, parent_fd)
        if member.isdir():
            self._make_dir(parent_fd, base, path, member)
        elif member.isreg():
            self._make_file(archive, parent_fd, base, path, member)
        elif member.issym():
            self._make_symlink(parent_fd, base, member)
        elif member.islnk():
            self._make_hardlink(parent_fd, base, path, member)
        elif member.isfifo() or member.ischr() or member.isblk():
            self._make_special(parent_fd, base, path, member)
        else:
            self._warn(f"skipped {display(path)}: unsupported tar entry type {member.type!r}")
            return
        self._mark_created(path)

    def _dir_meta(self, member: tarfile.TarInfo) -> _DirMeta:
        return _DirMeta(stat.S_IMODE(member.mode), _mtime_ns(member), member.uid, member.gid)

    def _make_dir(self, parent_fd: int, name: str, path: Parts, member: tarfile.TarInfo) -> None:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                self._clear(parent_fd, name)
                os.mkdir(name, 0o700, dir_fd=parent_fd)
        self.dirs[path] = self._dir_meta(member)
        xattrs = _xattrs(member)
        if xattrs:
            fd = os.open(name, DIR_READ, dir_fd=parent_fd)
            try:
                self._set_xattrs(fd, path, xattrs)
            finally:
                os.close(fd)

    def _create_file(self, parent_fd: int, name: str, mode: int = 0o600) -> int:
        try:
            return os.open(name, _CREATE_FLAGS, mode, dir_fd=parent_fd)
        except FileExistsError:
            self._clear(parent_fd, name)
            return os.open(name, _CREATE_FLAGS, mode, dir_fd=parent_fd)

    def _make_file(self, archive: tarfile.TarFile, parent_fd: int, name: str, path: Parts,
                   member: tarfile.TarInfo) -> None:
        mode = stat.S_IMODE(member.mode)
        # rootless, with no chown to come: created with its mode where the umask keeps it
        exact = self.rootless and created_exactly(mode, self.umask)
        fd = self._create_file(parent_fd, name, mode if exact else 0o600)
        try:
            if member.sparse is not None:
                self._write_sparse(archive, fd, path, member)
            elif member.size:
                for chunk in _member_data(archive, member):
                    if self.budget is not None:
                        self.budget.charge(len(chunk))
                    write_all(fd, chunk)
                    self.report.bytes_written += len(chunk)
            self._finish_inode(fd, member, path, mode_set=exact)
        finally:
            os.close(fd)

    def _write_sparse(self, archive: tarfile.TarFile, fd: int, path: Parts,
                      member: tarfile.TarInfo) -> None:
        """A sparse member (GNU old, GNU PAX 0.0/0.1/1.0): its data blocks written at their
        offsets, the holes left as holes (seek, then ``ftruncate`` to the real size)."""
        stream = archive.fileobj
        assert stream is not None and member.sparse is not None
        stream.seek(member.offset_data)
        blocks = cast("list[tuple[int, int]]", member.sparse)  # typeshed says list[int]
        for offset, numbytes in blocks:
            if offset < 0 or numbytes < 0 or offset + numbytes > member.size:
                raise LayerError(f"sparse file {display(path)} has a block at {offset}+"
                                 f"{numbytes}, past its size {member.size}", _CORRUPT_HINT)
            remaining = numbytes
            while remaining:
                chunk = stream.read(min(remaining, COPY_CHUNK))
                if not chunk:
                    raise tarfile.ReadError("unexpected end of data")
                if self.budget is not None:
                    self.budget.charge(len(chunk))
                _pwrite_all(fd, chunk, offset + numbytes - remaining)
                remaining -= len(chunk)
                self.report.bytes_written += len(chunk)
        os.ftruncate(fd, member.size)

    def _finish_inode(self, fd: int, member: tarfile.TarInfo, path: Parts,
                      mode_set: bool = False) -> None:
        """Owner, mode (unless ``mode_set`` at creation), xattrs and times of a file opened
        for writing (the mode after the data and the owner: both clear setuid bits)."""
        if not self.rootless:
            os.fchown(fd, member.uid, member.gid)
        if not mode_set:
            os.fchmod(fd, stat.S_IMODE(member.mode))
        xattrs = _xattrs(member)
        if xattrs:
            self._set_xattrs(fd, path, xattrs)
        mtime = _mtime_ns(member)
        os.utime(fd, ns=(mtime, mtime))

    def _make_symlink(self, parent_fd: int, name: str, member: tarfile.TarInfo) -> None:
        try:
            os.symlink(member.linkname, name, dir_fd=parent_fd)
        except FileExistsError:
            self._clear(parent_fd, name)
            os.symlink(member.linkname, name, dir_fd=parent_fd)
        if not self.rootless:
            os.chown(name, member.uid, member.gid, dir_fd=parent_fd, follow_symlinks=False)
        if _xattrs(member):
            self._warn(f"skipped xattrs of symlink {member.name!r}")
        mtime = _mtime_ns(member)
        os.utime(name, ns=(mtime, mtime), dir_fd=parent_fd, follow_symlinks=False)

    def _make_hardlink(self, parent_fd: int, name: str, path: Parts,
                       member: tarfile.TarInfo) -> None:
        target = normalize(member.linkname)
        missing = LayerError(
            f"hardlink {display(path)} points to {member.linkname!r}, which does not exist",
            "a hardlink must name a file of this layer or of a lower one; the image is broken")
        if not target:
            raise missing
        parent_fd = os.dup(parent_fd)
        try:
            found = self.root.resolve_dir(target[:-1])
            if found is None:
                raise missing
            source_fd, source_parent = found
            source = (*source_parent, target[-1])
            try:
                info = os.stat(target[-1], dir_fd=source_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise missing from None
            if stat.S_ISDIR(info.st_mode):
                raise LayerError(f"hardlink {display(path)} points to directory "
                                 f"{display(source)}", "hardlinks to directories are invalid")
            if source == path:
                return
            if source[:len(path)] == path:
                raise LayerError(f"hardlink {display(path)} would replace the directory holding "
                                 f"its own target {display(source)}", "the image is broken")
            source_fd = os.dup(source_fd)
            try:
                try:
                    os.link(target[-1], name, src_dir_fd=source_fd, dst_dir_fd=parent_fd,
                            follow_symlinks=False)
                except FileExistsError:
                    self._clear(parent_fd, name)
                    try:
                        os.link(target[-1], name, src_dir_fd=source_fd, dst_dir_fd=parent_fd,
                                follow_symlinks=False)
                    except FileNotFoundError:
                        raise missing from None
            finally:
                os.close(source_fd)
        finally:
            os.close(parent_fd)

    def _make_special(self, parent_fd: int, name: str, path: Parts,
                      member: tarfile.TarInfo) -> None:
        mode = stat.S_IMODE(member.mode)
        device_node = member.ischr() or member.isblk()
        if device_node and self.rootless:
            kind = "character" if member.ischr() else "block"
            self._warn(f"{display(path)}: {kind} device {member.devmajor}:{member.devminor} "
                       f"replaced by an empty file (rootless)")
            fd = self._create_file(parent_fd, name)
            try:
                self._finish_inode(fd, member, path)
            finally:
                os.close(fd)
            return
        if member.isfifo():
            kind_bits = stat.S_IFIFO
            device = 0
        else:
            kind_bits = stat.S_IFCHR if member.ischr() else stat.S_IFBLK
            device = os.makedev(member.devmajor, member.devminor)
        try:
            os.mknod(name, 0o600 | kind_bits, device, dir_fd=parent_fd)
        except FileExistsError:
            self._clear(parent_fd, name)
            os.mknod(name, 0o600 | kind_bits, device, dir_fd=parent_fd)
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        try:
            if stat.S_ISLNK(os.fstat(fd).st_mode):  # pragma: no cover - we just made it
                raise LayerError(f"{display(path)} changed while being created")
            if not self.rootless:
                chown_path_fd(fd, member.uid, member.gid)
            chmod_path_fd(fd, mode)
        finally:
            os.close(fd)
        if _xattrs(member):
            self._warn(f"skipped xattrs of special file {display(path)}")
        mtime = _mtime_ns(member)
        os.utime(name, ns=(mtime, mtime), dir_fd=parent_fd, follow_symlinks=False)

    def _set_xattrs(self, fd: int, path: Parts, xattrs: dict[str, bytes]) -> None:
        for key, value in xattrs.items():
            try:
                os.setxattr(fd, key, value)
            except OSError as exc:
                if exc.errno not in _XATTR_SKIPPABLE:
                    raise
                self._warn(f"{display(path)}: xattr {key} not set ({exc.strerror})")

    # -- whiteouts -----------------------------------------------------------------------------

    def _whiteout(self, parts: Parts) -> None:
        base = parts[-1]
        if base != OPAQUE_MARKER and base.startswith(OPAQUE_MARKER[:8]):
            self._warn(f"skipped AUFS metadata entry {display(parts)}")
            return
        if base != OPAQUE_MARKER:
            victim = base[len(WHITEOUT_PREFIX):]
            if victim in ("", ".", ".."):
                raise LayerError(f"invalid whiteout entry {display(parts)}",
                                 "a whiteout must name a file: .wh.NAME; the image is broken")
        found = self.root.resolve_dir(parts[:-1])
        if found is None:
            return
        parent_fd, parent = found
        parent_fd = os.dup(parent_fd)
        try:
            if base == OPAQUE_MARKER:
                for child in _list_dir(parent_fd):
                    self._remove_lower(parent_fd, parent, child)
            else:
                self._remove_lower(parent_fd, parent, victim)
        finally:
            os.close(parent_fd)

    def _remove_lower(self, parent_fd: int, parent: Parts, name: str) -> None:
        """Remove what lower layers put at ``parent/name``, keeping what this layer made."""
        path = (*parent, name)
        try:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if "/".join(path) in self.created or path in self.created_ancestors:
            if stat.S_ISDIR(info.st_mode):
                fd = os.open(name, DIR_READ, dir_fd=parent_fd)
                try:
                    for child in _list_dir(fd):
                        self._remove_lower(fd, path, child)
                finally:
                    os.close(fd)
            return
        self._save_mtime(parent, parent_fd)
        remove_at(parent_fd, name)
        if stat.S_ISDIR(info.st_mode) or stat.S_ISLNK(info.st_mode):
            self.root.invalidate()

    # -- the end -------------------------------------------------------------------------------

    def finish(self) -> None:
        """Set directory modes and times (deepest first), restore touched lower directories."""
        for path in sorted(self.dirs, key=len, reverse=True):
            meta = self.dirs[path]
            fd = self._open_dir_nofollow(path)
            if fd is None:
                continue
            try:
                if not self.rootless:
                    os.fchown(fd, meta.uid, meta.gid)
                os.fchmod(fd, meta.mode | 0o700 if self.rootless else meta.mode)
                os.utime(fd, ns=(meta.mtime_ns, meta.mtime_ns))
            finally:
                os.close(fd)
        for path, (atime, mtime) in self.saved_mtimes.items():
            if path in self.dirs:
                continue
            fd = self._open_dir_nofollow(path)
            if fd is None:
                continue
            try:
                os.utime(fd, ns=(atime, mtime))
            finally:
                os.close(fd)

    def _open_dir_nofollow(self, path: Parts) -> int | None:
        found = self.root.resolve_dir(path, follow=False)
        if found is None:
            return None
        return open_readable_dir(found[0])


def _list_dir(dir_fd: int) -> list[str]:
    fd = open_readable_dir(dir_fd)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _member_data(archive: tarfile.TarFile, member: tarfile.TarInfo) -> Iterator[bytes | memoryview]:
    """The data of a plain (not sparse) regular member, in chunks of at most ``COPY_CHUNK``.

    Read straight from the archive's stream (``extractfile`` builds two file objects per
    member: measurable on layers of small files), with the padding to the next 512-byte
    block: the stream is then where ``tarfile`` expects the next header, which it otherwise
    reaches by a seek and a one-byte read. A small file is one read, data and padding.
    """
    stream = archive.fileobj
    assert stream is not None  # an open archive has its stream
    stream.seek(member.offset_data)
    size = member.size
    padding = -size % tarfile.BLOCKSIZE
    if size + padding <= COPY_CHUNK:
        block = stream.read(size + padding)
        if len(block) != size + padding:  # as tarfile's own check before the next header
            raise tarfile.ReadError("unexpected end of data")
        yield memoryview(block)[:size] if padding else block
        return
    remaining = size
    while remaining:
        chunk = stream.read(min(remaining, COPY_CHUNK))
        if not chunk:
            raise tarfile.ReadError("unexpected end of data")
        remaining -= len(chunk)
        yield chunk
    if len(stream.read(padding)) != padding:
        raise tarfile.ReadError("unexpected end of data")


_NS_MAX = (1 << 63) - 1  # what a 64-bit timespec holds, in ns (years 1678 to 2262)
_S_MAX = Decimal(_NS_MAX).scaleb(-9)


def _mtime_ns(member: tarfile.TarInfo) -> int:
    """The entry's mtime in ns; exact for PAX decimal mtimes (a float would round them).

    An mtime that is not a number (``nan``) counts as 0; one out of range (``inf``, ``1e30``)
    is clamped to what the filesystem can hold.
    """
    text = member.pax_headers.get("mtime") if member.pax_headers else None
    try:
        if text is not None:
            ns = int(Decimal(text).scaleb(9).to_integral_value())
        else:
            ns = round(float(member.mtime) * 1_000_000_000)
    except (ArithmeticError, ValueError):  # nan, inf, 1e999999, text that is not a number
        return _odd_mtime_ns(text, member.mtime)
    return ns if -_NS_MAX <= ns <= _NS_MAX else (_NS_MAX if ns > 0 else -_NS_MAX)


def _odd_mtime_ns(text: str | None, mtime: float) -> int:
    value: Decimal | None = None
    if text is not None:
        with contextlib.suppress(InvalidOperation):
            value = Decimal(text)
    if value is None:
        try:
            value = Decimal(mtime)
        except (InvalidOperation, TypeError, ValueError):
            return 0
    if value.is_nan():
        return 0
    if abs(value) >= _S_MAX:  # inf, 1e30, 1e999999 (whose ns would overflow Decimal)
        return _NS_MAX if value > 0 else -_NS_MAX
    return int(value.scaleb(9).to_integral_value())


def _xattrs(member: tarfile.TarInfo) -> dict[str, bytes]:
    headers = member.pax_headers
    if not headers:
        return {}
    return {key[len(XATTR_PAX_PREFIX):]: value.encode("utf-8", "surrogateescape")
            for key, value in headers.items() if key.startswith(XATTR_PAX_PREFIX)}
