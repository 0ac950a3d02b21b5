"""Read a layer's tar stream front to back, fast, with ``tarfile``'s semantics.

A forward-only stream for ``tarfile``'s ``r:`` mode (:class:`ForwardReader`), a header parser
for plain ustar headers that skips ``TarFile.next()``'s bookkeeping (:func:`members`), and the
readers of a member's data, mtime and xattrs. Everything a layer applier needs to know about
the archive format; nothing here writes to a file system. See docs/performance.md.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import struct
import tarfile
import zlib
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import BinaryIO, Self

XATTR_PAX_PREFIX = "SCHILY.xattr."
COPY_CHUNK = 1 << 20
READ_CHUNK = 1 << 20  # what ForwardReader asks its source for at once
#: the most ForwardReader.read returns at once: file data is read in COPY_CHUNKs, so only a
#: header's metadata (pax records, a GNU long name) comes whole, and none is near this
READ_LIMIT = 64 << 20


class ForwardReader:
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
        """``size`` bytes (fewer only at the end), or the rest of the stream. tarfile asks for
        a whole extended (pax) or long-name header at once, of the size its header claims:
        more than :data:`READ_LIMIT` is refused (``tarfile.ReadError``), not read into memory,
        as is a rest of the stream larger than that (a negative base-256 size)."""
        if size is not None and size > READ_LIMIT:
            raise tarfile.ReadError(f"a tar header claims {size} bytes of metadata, more than "
                                    f"the {READ_LIMIT} a real one takes")
        if size is None or size < 0:
            parts = [self._buf[self._pos:]]
            have = len(parts[0])
            while chunk := self._raw.read(READ_CHUNK):
                parts.append(chunk)
                have += len(chunk)
                if have > READ_LIMIT:
                    raise tarfile.ReadError("a tar header claims the rest of the layer as its "
                                            f"metadata, more than {READ_LIMIT} bytes")
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

    def read_at(self, offset: int, size: int) -> bytes:
        """``seek(offset)``, then ``read(size)``: one call, a slice where it is buffered."""
        start = offset - self._base
        end = start + size
        if start == self._pos and end <= len(self._buf):
            self._pos = end
            return self._buf[start:end]
        self.seek(offset)
        return self.read(size)

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
        if whence == os.SEEK_SET and offset == self._base + self._pos:
            return offset  # already there: each member's data, read right after its header
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


# a ustar header: name 100, mode 8, uid 8, gid 8, size 12, mtime 12, chksum 8, type 1,
# linkname 100, magic and version 8, uname 32, gname 32, devmajor 8, devminor 8, prefix 155
_TEXT_FIELDS = struct.Struct("100s48x8s1s100s8x32s32s16x155s")  # name chksum type link u g pre
_NUMERIC_FIELDS = struct.Struct("100x8s8s8s12s12s8s1x100x8x64x8s8s")  # mode .. chksum, dev
_BLOCK = tarfile.BLOCKSIZE
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
        member = cls.plain_header(buf, encoding, errors)
        return member if member is not None else super().frombuf(buf, encoding, errors)

    @classmethod
    def plain_header(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self | None:
        """The member of a whole 512-byte header that is not GNU sparse, or None where
        tarfile's parser must decide (it may raise, or read what this does not)."""
        name, chksum, type_, linkname, uname, gname, prefix = _TEXT_FIELDS.unpack_from(buf)
        # the numeric fields, from the header with its NULs made blanks (one translate)
        mode, uid, gid, size, mtime, blank_chksum, major, minor = \
            _NUMERIC_FIELDS.unpack_from(buf.translate(_NUL_TO_BLANK))
        try:
            # int() of bytes accepts what tarfile's nti accepts of plain fields (digits, ASCII
            # blanks around them, "_", "+", "0o") once the NULs are blanks; anything else
            # (base-256, text after a NUL, non-ASCII, an empty field but for the device
            # numbers) raises ValueError, and tarfile decides
            checksum = int(blank_chksum, 8)
            fields = (int(mode, 8), int(uid, 8), int(gid, 8), int(size, 8), int(mtime, 8),
                      0 if major == _BLANK8 else int(major, 8),
                      0 if minor == _BLANK8 else int(minor, 8))
        except ValueError:
            return None
        unsigned = 256 + _byte_sum(buf) - sum(chksum)
        if checksum != unsigned and not _signed_checksum_matches(buf, checksum, unsigned):
            # an empty block or a bad checksum: tarfile raises its "empty header" or
            # "bad checksum"
            return None
        # every attribute TarInfo.__init__ sets (_INIT_ATTRS), each once: not its defaults
        # first and then these (its __init__ was a sixth of the bytecodes of an entry)
        obj = cls.__new__(cls)
        obj.mode, obj.uid, obj.gid, obj.size, obj.mtime, obj.devmajor, obj.devminor = fields
        obj.chksum = checksum
        obj.name = name.split(b"\0", 1)[0].decode(encoding, errors)
        obj.type = type_
        obj.linkname = linkname.split(b"\0", 1)[0].decode(encoding, errors)
        obj.uname = uname.split(b"\0", 1)[0].decode(encoding, errors)
        obj.gname = gname.split(b"\0", 1)[0].decode(encoding, errors)
        obj.offset = obj.offset_data = 0
        obj.sparse = None
        obj.pax_headers = {}
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
                or not isinstance(stream, ForwardReader) or not 0 <= length <= _PAX_FAST_LIMIT
                or "hdrcharset" in tarfile_.pax_headers):
            # a negative size (base-256) is tarfile's to read: it reads to the end then
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
#: the plain types whose data follows the header (``isreg()`` but for sparse, which is not
#: plain): regular files the applier writes from :func:`member_data`
PLAIN_FILE_TYPES = frozenset((tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE))


def members(archive: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members of ``archive``, read front to back as ``archive.next()`` reads them, none
    kept (tarfile keeps every member it reads: memory would grow with the layer).

    With the fast parser over a :class:`ForwardReader`, a plain header (:data:`_PLAIN_TYPES`)
    where tarfile expects the next one, with no global PAX header in force, is parsed here: the
    member and the archive's next offset come out as ``next()`` makes them, without its
    per-member bookkeeping (four ``tell()`` calls, three dispatching methods, the members
    list). Anything else (extended and GNU headers, the end of the archive, a short or damaged
    header, a field the fast parse leaves to tarfile, a member whose data was not read to its
    end) is left where it is, unread, for ``archive.next()``.
    """
    stream = archive.fileobj
    reader = (stream if isinstance(stream, ForwardReader) and archive.tarinfo is _TarInfo
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


def _plain_member(archive: tarfile.TarFile, stream: ForwardReader) -> tarfile.TarInfo | None:
    """The member whose plain header comes next, consumed; None (nothing consumed) if the
    next header is not one :func:`members` reads itself."""
    buf = stream.peek_exact(_BLOCK)
    if len(buf) != _BLOCK or buf[156:157] not in _PLAIN_TYPES:
        return None
    member = _TarInfo.plain_header(buf, archive.encoding, archive.errors)
    if member is None:
        return None  # the end of the archive, damage, odd fields: next() reads it and decides
    stream.consume(_BLOCK)
    member.offset = archive.offset
    member.offset_data = data = archive.offset + _BLOCK
    # as TarInfo._proc_builtin: a regular file's data (rounded up to whole blocks, as
    # TarInfo._block rounds) follows
    archive.offset = (data - (-member.size // _BLOCK) * _BLOCK
                      if member.type in PLAIN_FILE_TYPES else data)
    return member


#: the attributes ``TarInfo.__init__`` sets, which ``_TarInfo.frombuf`` sets without it
_INIT_ATTRS = frozenset(("name", "mode", "uid", "gid", "size", "mtime", "chksum", "type",
                         "linkname", "uname", "gname", "devmajor", "devminor", "offset",
                         "offset_data", "sparse", "pax_headers"))
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
        made = tarfile.TarInfo()
        if {slot for slot in tarfile.TarInfo.__slots__ if hasattr(made, slot)} != _INIT_ATTRS:
            return False  # frombuf would leave an attribute unset, or set one too many
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
    with tarfile.open(fileobj=ForwardReader(buffer), mode="r:",  # type: ignore[call-overload]
                      tarinfo=tarinfo) as archive:
        return [(m.name, m.size, m.mtime, m.mode, m.type, m.linkname, m.offset, m.offset_data,
                 dict(m.pax_headers), b"".join(member_data(archive, m)) if m.isreg() else b"")
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


def _signed_checksum_matches(buf: bytes | bytearray, checksum: int, unsigned: int) -> bool:
    """Whether the header ``buf`` (whose unsigned sum is not ``checksum``) has the checksum
    of old tars that summed signed bytes; an all-NUL block never matches (the off path: a
    plain header's checksum is the unsigned sum)."""
    if buf.count(0) == tarfile.BLOCKSIZE:
        return False
    signed = unsigned - 256 * (sum(1 for b in buf[:148] if b > 127)
                               + sum(1 for b in buf[156:] if b > 127))
    return checksum == signed


def _byte_sum(block: bytes | bytearray) -> int:
    """``sum(block)`` of a 512-byte header, 4x faster: the low 16 bits of an Adler-32 are
    1 + the byte sum modulo 65521, and each 256-byte half sums to at most 65280."""
    view = memoryview(block)
    return (zlib.adler32(view[:256]) & 0xFFFF) + (zlib.adler32(view[256:]) & 0xFFFF) - 2



def small_member_data(archive: tarfile.TarFile,
                      member: tarfile.TarInfo) -> bytes | memoryview | None:
    """The data of a plain regular member that fits one read with its padding (as
    :func:`member_data` yields it, without a generator), consumed; None (nothing read) for a
    larger one."""
    size = member.size
    padding = -size % tarfile.BLOCKSIZE
    if size + padding > COPY_CHUNK:
        return None
    stream = archive.fileobj
    assert stream is not None  # an open archive has its stream
    if isinstance(stream, ForwardReader):
        block = stream.read_at(member.offset_data, size + padding)
    else:
        stream.seek(member.offset_data)
        block = stream.read(size + padding)
    if len(block) != size + padding:  # as tarfile's own check before the next header
        raise tarfile.ReadError("unexpected end of data")
    return memoryview(block)[:size] if padding else block


def member_data(archive: tarfile.TarFile, member: tarfile.TarInfo) -> Iterator[bytes | memoryview]:
    """The data of a plain (not sparse) regular member, in chunks of at most ``COPY_CHUNK``.

    Read straight from the archive's stream (``extractfile`` builds two file objects per
    member: measurable on layers of small files), with the padding to the next 512-byte
    block: the stream is then where ``tarfile`` expects the next header, which it otherwise
    reaches by a seek and a one-byte read. A small file is one read, data and padding.
    """
    block = small_member_data(archive, member)
    if block is not None:
        yield block
        return
    stream = archive.fileobj
    assert stream is not None  # an open archive has its stream
    stream.seek(member.offset_data)
    size = member.size
    padding = -size % tarfile.BLOCKSIZE
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
#: whole seconds below this times 10**9 fit a double's 53 bits (s * 2**9 * 5**9, 5**9 < 2**21):
#: ``round(float(s) * 1e9)`` is exact there, and equal to the integer product (to 2116)
_EXACT_FLOAT_S = (1 << 53) // 5**9


def mtime_ns(member: tarfile.TarInfo) -> int:
    """The entry's mtime in ns; exact for PAX decimal mtimes (a float would round them).

    An mtime that is not a number (``nan``) counts as 0; one out of range (``inf``, ``1e30``)
    is clamped to what the filesystem can hold.
    """
    pax = member.pax_headers
    mtime = member.mtime
    if not pax and type(mtime) is int and 0 <= mtime < _EXACT_FLOAT_S:
        return mtime * 1_000_000_000  # what the float product below gives there, exactly
    text = pax.get("mtime") if pax else None
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


def member_xattrs(member: tarfile.TarInfo) -> dict[str, bytes]:
    headers = member.pax_headers
    if not headers:
        return {}
    return {key[len(XATTR_PAX_PREFIX):]: value.encode("utf-8", "surrogateescape")
            for key, value in headers.items() if key.startswith(XATTR_PAX_PREFIX)}
