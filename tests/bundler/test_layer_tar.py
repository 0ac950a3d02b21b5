"""The tar parsing fast paths of ocistage.bundler.unpack.tarstream give exactly tarfile's results.

``_TarInfo.frombuf`` (ustar headers) and ``_TarInfo._proc_pax`` (PAX extended headers) take the
common cases and defer the rest to tarfile; every test here compares them with tarfile's own
parser on the same bytes, including malformed ones.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ocistage.bundler.unpack import tarstream
from ocistage.bundler.unpack.tarstream import ForwardReader, _pax_records, _TarInfo

FIELDS = ("name", "mode", "uid", "gid", "size", "mtime", "chksum", "type", "linkname", "uname",
          "gname", "devmajor", "devminor")


def _parsed(parse: Callable[[bytes], tarfile.TarInfo], buf: bytes) -> object:
    try:
        info = parse(buf)
    except tarfile.HeaderError as exc:
        return type(exc).__name__
    return tuple(getattr(info, name) for name in FIELDS)


def _header(fields: dict[str, bytes], fix_checksum: bool) -> bytes:
    layout = {"name": (0, 100), "mode": (100, 8), "uid": (108, 8), "gid": (116, 8),
              "size": (124, 12), "mtime": (136, 12), "chksum": (148, 8), "type": (156, 1),
              "linkname": (157, 100), "magic": (257, 8), "uname": (265, 32),
              "gname": (297, 32), "devmajor": (329, 8), "devminor": (337, 8),
              "prefix": (345, 155)}
    buf = bytearray(512)
    for key, value in fields.items():
        offset, width = layout[key]
        buf[offset:offset + width] = value[:width].ljust(width, b"\0")
    if fix_checksum:
        buf[148:156] = b" " * 8
        buf[148:156] = b"%06o\0 " % sum(buf)
    return bytes(buf)


NUMBER = st.one_of(
    st.integers(0, 0o7777777).map(lambda n: b"%07o" % n),
    st.integers(0, 0o7777777).map(lambda n: b" %o \0" % n),
    st.binary(min_size=0, max_size=12),
    st.sampled_from([b"", b"\x80\0\0\0\0\0\x01\x00", b"\xff" * 8, b"0_7", b"+7", b"\x1c7",
                     b"9", b"07\x00garbage", b"\0" * 8, b" " * 8, b"  \0\0", b"\t12\0",
                     b"07 \x0012", b"0o17", b"-7"]),
)
TEXT = st.one_of(st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
                 st.binary(max_size=120))


@settings(max_examples=400, deadline=None)
@given(name=TEXT, prefix=TEXT, linkname=TEXT, mode=NUMBER, uid=NUMBER, gid=NUMBER,
       size=NUMBER, mtime=NUMBER, devmajor=NUMBER, devminor=NUMBER, type_=st.sampled_from(
           [b"0", b"\0", b"5", b"2", b"1", b"x", b"g", b"L", b"S", b"3", b"7", b"Z"]),
       magic=st.sampled_from([b"ustar\x0000", b"ustar  \0", b""]),
       fix_checksum=st.booleans())
def test_fast_header_parser_gives_tarfiles_results(
        name: bytes, prefix: bytes, linkname: bytes, mode: bytes, uid: bytes, gid: bytes,
        size: bytes, mtime: bytes, devmajor: bytes, devminor: bytes, type_: bytes,
        magic: bytes, fix_checksum: bool) -> None:
    buf = _header({"name": name, "prefix": prefix, "linkname": linkname, "mode": mode,
                   "uid": uid, "gid": gid, "size": size, "mtime": mtime, "devmajor": devmajor,
                   "devminor": devminor, "type": type_, "magic": magic, "uname": b"root",
                   "gname": b"root"}, fix_checksum)
    for candidate in (buf, buf[:300], b"", b"\0" * 512):
        ours = _parsed(lambda b: _TarInfo.frombuf(b, "utf-8", "surrogateescape"), candidate)
        theirs = _parsed(lambda b: tarfile.TarInfo.frombuf(b, "utf-8", "surrogateescape"),
                         candidate)
        assert ours == theirs
    try:
        reference = tarfile.TarInfo.frombuf(buf, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return
    # frombuf's object is built without TarInfo.__init__: every attribute it sets is there,
    # with tarfile's value, and nothing else
    fast = _TarInfo.frombuf(buf, "utf-8", "surrogateescape")
    for slot in tarfile.TarInfo.__slots__:
        assert hasattr(fast, slot) == hasattr(reference, slot), slot
        if hasattr(reference, slot):
            assert getattr(fast, slot) == getattr(reference, slot), slot



HEADER = st.builds(
    lambda name, size, type_, fix, body: (_header({
        "name": name, "size": size, "type": type_, "mode": b"0000644", "uid": b"0000000",
        "gid": b"0000000", "mtime": b"00000000001", "magic": b"ustar\x0000"}, fix), body),
    name=st.one_of(st.sampled_from([b"a", b"d/", b"d/f", b"./x", b"l/" + b"n" * 97]), TEXT),
    size=st.one_of(st.integers(0, 1500).map(lambda n: b"%011o" % n), NUMBER),
    type_=st.sampled_from([b"0", b"\0", b"5", b"2", b"1", b"3", b"6", b"7", b"x", b"g", b"L",
                           b"S", b"Z"]),
    fix=st.integers(0, 9).map(lambda n: n > 0),  # mostly valid checksums
    body=st.binary(max_size=1500))


@settings(max_examples=300, deadline=None)
@given(entries=st.lists(HEADER, max_size=8), read_data=st.booleans(),
       end=st.sampled_from([b"\0" * 1024, b"\0" * 512, b"", b"junk"]))
# an extended header whose size is a negative base-256 number: tarfile reads to the end
@example(entries=[(_header({"name": b"a", "size": b"\xff", "type": b"x", "mode": b"0000644",
                            "uid": b"0000000", "gid": b"0000000", "mtime": b"00000000001",
                            "magic": b"ustar\x0000"}, True), b"")],
         read_data=False, end=b"\0" * 1024)
# an extended header whose base-256 size is 2**80: refused, not read (it was an OverflowError
# from the read, an internal error for the user)
@example(entries=[(_header({"name": b"a", "size": b"00000000001", "type": b"0",
                            "mode": b"0000644", "uid": b"0000000", "gid": b"0000000",
                            "mtime": b"00000000001", "magic": b"ustar\x0000"}, True), b"\0"),
                  (_header({"name": b"a", "size": b"\x80\x01", "type": b"x", "mode": b"0000644",
                            "uid": b"0000000", "gid": b"0000000", "mtime": b"00000000001",
                            "magic": b"ustar\x0000"}, True), b"")],
         read_data=False, end=b"\0" * 1024)
def test_members_reads_plain_headers_as_tarfiles_next_does(
        entries: list[tuple[bytes, bytes]], read_data: bool, end: bytes) -> None:
    """Archives of plain and other headers, with and without their data read: the members,
    offsets and errors of tarstream.members() are tarfile's."""
    data = b"".join(header + body + b"\0" * (-len(body) % 512) for header, body in entries)
    data += end

    def listed(fast: bool) -> object:
        found: list[object] = []
        stream = ForwardReader(io.BytesIO(data))
        try:
            with tarfile.open(fileobj=stream, mode="r:",  # type: ignore[call-overload]
                              tarinfo=_TarInfo if fast else tarfile.TarInfo) as archive:
                for member in (tarstream.members(archive) if fast else iter(archive.next, None)):
                    found.append(repr([getattr(member, name) for name in MEMBER_FIELDS]))
                    if read_data and member.isreg() and member.sparse is None:
                        found.append(b"".join(tarstream.member_data(archive, member)))
        except (tarfile.TarError, ValueError, OSError) as exc:  # OSError: a backward seek
            found.append((type(exc).__name__, str(exc)))
        return found

    assert listed(fast=True) == listed(fast=False)


class _Trickle(io.RawIOBase):
    """A source that returns reads of at most ``chunk`` bytes, as a pipe does."""

    def __init__(self, data: bytes, chunk: int) -> None:
        self.data, self.chunk, self.pos = data, chunk, 0

    def read(self, size: int = -1) -> bytes:
        out = self.data[self.pos:self.pos + min(self.chunk, size if size >= 0 else self.chunk)]
        self.pos += len(out)
        return out

@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=0, max_size=5000),
       steps=st.lists(st.tuples(st.sampled_from(["read", "skip", "peek"]),
                                st.integers(0, 1500)),
                      max_size=30),
       chunk=st.integers(1, 700))
def test_forward_reader_reads_peeks_and_skips_like_a_file(data: bytes, steps: list[tuple[str, int]],
                                                    chunk: int) -> None:
    reader = ForwardReader(_Trickle(data, chunk))  # type: ignore[arg-type]
    reference = io.BytesIO(data)
    for op, n in steps:
        if op == "peek":  # the bytes ahead, without consuming them
            here = reference.tell()
            assert reader.peek_exact(n) == data[here:here + n]
        elif op == "read":
            assert reader.read(n) == reference.read(n)
        else:
            target = min(reference.tell() + n, len(data))
            reference.seek(target)
            assert reader.seek(target) == target
        assert reader.tell() == reference.tell()
    assert reader.read() == reference.read()
    assert reader.seek(len(data) + 10) == len(data)  # past the end: stops there, as tarfile needs
    assert reader.read(1) == b""
    with pytest.raises(OSError):
        reader.seek(reader.tell() - 1)  # backwards: refused


# -- PAX extended headers --------------------------------------------------------------------

MEMBER_FIELDS = ("name", "size", "mtime", "uid", "gid", "uname", "gname", "linkname", "type",
                 "mode", "offset", "offset_data", "pax_headers")


def _pax_header(payload: bytes, kind: bytes = tarfile.XHDTYPE) -> bytes:
    header = tarfile.TarInfo("././@PaxHeader")
    header.type = kind
    header.size = len(payload)
    block = header.tobuf(tarfile.USTAR_FORMAT)
    padding = -len(payload) % tarfile.BLOCKSIZE
    return block + payload + b"\0" * padding


def _archive(pax_payload: bytes, kind: bytes = tarfile.XHDTYPE) -> bytes:
    """A PAX header with ``pax_payload``, a file of 700 bytes, then a symlink; end blocks."""
    out = io.BytesIO()
    out.write(_pax_header(pax_payload, kind))
    member = tarfile.TarInfo("dir/file")
    member.size = 700
    out.write(member.tobuf(tarfile.USTAR_FORMAT))
    out.write(b"x" * 700 + b"\0" * (-700 % tarfile.BLOCKSIZE))
    link = tarfile.TarInfo("dir/link")
    link.type = tarfile.SYMTYPE
    link.linkname = "file"
    out.write(link.tobuf(tarfile.USTAR_FORMAT))
    out.write(b"\0" * tarfile.BLOCKSIZE * 2)
    return out.getvalue()


def _members(data: bytes, fast: bool) -> object:
    """What tarfile (or our fast path) makes of ``data``: each member's fields, or the error."""
    found: list[object] = []
    stream = ForwardReader(io.BytesIO(data)) if fast else io.BytesIO(data)
    try:
        with tarfile.open(fileobj=stream, mode="r:",  # type: ignore[call-overload]
                          tarinfo=_TarInfo if fast else tarfile.TarInfo) as archive:
            for member in (tarstream.members(archive) if fast else iter(archive.next, None)):
                found.append(repr([getattr(member, name) for name in MEMBER_FIELDS]))  # NaN
                if member.isreg():
                    source = archive.extractfile(member)
                    assert source is not None
                    found.append(source.read(1024))  # sizes come from the records
    except (tarfile.TarError, ValueError) as exc:  # tarfile's sparse code raises ValueError
        found.append((type(exc).__name__, str(exc)))
    return found


def _record(keyword: bytes, value: bytes) -> bytes:
    body = b" " + keyword + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length).encode()) + len(body) != length:
        length += 1
    return str(length).encode() + body


KEYWORDS = st.sampled_from([b"path", b"linkpath", b"size", b"mtime", b"uid", b"gid", b"uname",
                            b"gname", b"atime", b"comment", b"SCHILY.xattr.user.k",
                            b"hdrcharset", b"GNU.sparse.size", b"a b", b"k\xff", b""])
VALUES = st.one_of(
    st.sampled_from([b"", b"0", b"12", b"1700000000.123456789", b"-3", b"x" * 300, b"a=b",
                     b"line\nbreak", b"dir/other", b"BINARY", b"\xff\xfe", b"4096"]),
    st.text(max_size=30).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
RECORD = st.one_of(
    st.tuples(KEYWORDS, VALUES).map(lambda kv: _record(*kv)),
    st.binary(max_size=40),                                       # garbage
    st.tuples(KEYWORDS, VALUES, st.integers(-5, 5)).map(          # a wrong length
        lambda kvd: (lambda r: str(int(r.split(b" ", 1)[0]) + kvd[2]).encode() + b" "
                     + r.split(b" ", 1)[1])(_record(kvd[0], kvd[1]))),
)


@settings(max_examples=500, deadline=None)
@given(records=st.lists(RECORD, max_size=6),
       padding=st.sampled_from([b"", b"\0" * 3, b"junk"]),
       kind=st.sampled_from([tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE]))
def test_fast_pax_parser_gives_tarfiles_results(records: list[bytes], padding: bytes,
                                                kind: bytes) -> None:
    data = _archive(b"".join(records) + padding, kind)
    assert _members(data, fast=True) == _members(data, fast=False)


def test_fast_pax_parser_takes_plain_records_and_defers_the_rest() -> None:
    plain = _record(b"path", "dír/fïle".encode()) + _record(b"mtime", b"1.5")
    assert _pax_records(plain + b"\0" * 10) == {"path": "dír/fïle", "mtime": "1.5"}
    for deferred in (_record(b"hdrcharset", b"BINARY"), _record(b"GNU.sparse.size", b"1"),
                     _record(b"path", b"\xff"), b"7 path\n", plain + b"junk",
                     b"99 path=x\n", b"x" * 5):
        assert _pax_records(plain + deferred) is None, deferred
    assert _members(_archive(plain), fast=True) == _members(_archive(plain), fast=False)


def test_pax_size_moves_the_next_header_as_tarfile_does() -> None:
    # a PAX size that disagrees with the ustar header: tarfile trusts PAX; so do we
    data = _archive(_record(b"size", b"1024"))
    assert _members(data, fast=True) == _members(data, fast=False)
    for cut in (512, 1024, 1500, 2000):  # truncated anywhere: the same error as tarfile's
        assert _members(data[:cut], fast=True) == _members(data[:cut], fast=False)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=0, max_size=5000),
       steps=st.lists(st.tuples(st.integers(0, 1500), st.integers(0, 1500)), max_size=20),
       chunk=st.integers(1, 700))
def test_read_at_is_a_seek_then_a_read(data: bytes, steps: list[tuple[int, int]],
                                      chunk: int) -> None:
    reader = ForwardReader(_Trickle(data, chunk))  # type: ignore[arg-type]
    reference = io.BytesIO(data)
    for skip, size in steps:
        here = reference.tell() + skip * (skip % 3 == 0)  # mostly where the reader is
        reference.seek(min(here, len(data)))
        assert reader.read_at(here, size) == reference.read(size)
        assert reader.tell() == reference.tell()


def test_small_member_data_is_member_datas_one_chunk() -> None:
    buffer = io.BytesIO()
    sizes = (0, 1, 511, 512, 513, tarstream.COPY_CHUNK - 512, tarstream.COPY_CHUNK - 1,
             tarstream.COPY_CHUNK + 1)
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for n, size in enumerate(sizes):
            info = tarfile.TarInfo(f"f{n}")
            info.size = size
            archive.addfile(info, io.BytesIO(bytes([n + 1]) * size))
    for small in (True, False):
        buffer.seek(0)
        with tarfile.open(fileobj=ForwardReader(buffer), mode="r:",  # type: ignore[call-overload]
                          tarinfo=_TarInfo) as archive:
            got = []
            for member in tarstream.members(archive):
                block = tarstream.small_member_data(archive, member) if small else None
                if block is None:
                    block = b"".join(tarstream.member_data(archive, member))
                got.append(bytes(block))
        assert got == [bytes([n + 1]) * size for n, size in enumerate(sizes)]
    # the stream ends inside a small member's data or padding: tarfile's error
    data = buffer.getvalue()
    with tarfile.open(fileobj=ForwardReader(io.BytesIO(data[:512 * 4 + 100])), mode="r:",  # type: ignore[call-overload]
                      tarinfo=_TarInfo) as archive:
        members = tarstream.members(archive)
        next(members)
        assert tarstream.small_member_data(archive, next(members)) == b"\2"
        third = next(members)  # 511 bytes from 2048: cut after 100
        with pytest.raises(tarfile.ReadError, match="unexpected end of data"):
            tarstream.small_member_data(archive, third)


@given(seconds=st.one_of(st.integers(-10, 1 << 40), st.sampled_from(
    [0, 1, tarstream._EXACT_FLOAT_S - 1, tarstream._EXACT_FLOAT_S, 1 << 62, -(1 << 62)])))
def test_whole_second_mtimes_are_those_of_the_float_product(seconds: int) -> None:
    member = tarfile.TarInfo("f")
    member.mtime = seconds
    fast = tarstream.mtime_ns(member)
    member.mtime = float(seconds)  # a float mtime takes the general path
    assert fast == tarstream.mtime_ns(member)


# -- the fast parser's fallback -----------------------------------------------------------------


def test_the_fast_parser_is_used_while_tarfile_keeps_its_shape() -> None:
    assert tarstream.fast_parser_usable()


@pytest.mark.parametrize("change", ["missing", "signature", "attributes", "behaviour"])
def test_a_changed_tarfile_falls_back_to_the_public_parser(
        monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    if change == "missing":
        monkeypatch.delattr(tarfile.TarInfo, "_apply_pax_info")
    elif change == "signature":
        monkeypatch.setattr(tarfile.TarInfo, "_block",
                            lambda self, count, extra=0: count)
    elif change == "attributes":  # TarInfo() now sets an attribute frombuf does not
        original_init = tarfile.TarInfo.__init__

        def more(self: tarfile.TarInfo, name: str = "") -> None:
            original_init(self, name)
            self._link_target = None  # type: ignore[attr-defined]
        monkeypatch.setattr(tarfile.TarInfo, "__init__", more)
    else:  # same names and shapes, but tarfile now reads PAX headers differently
        original = tarfile.TarInfo._proc_pax  # type: ignore[attr-defined]

        def differently(self: tarfile.TarInfo, archive: tarfile.TarFile) -> tarfile.TarInfo:
            member: tarfile.TarInfo = original(self, archive)
            member.mtime = 0
            return member
        monkeypatch.setattr(tarfile.TarInfo, "_proc_pax", differently)
    assert not tarstream.fast_parser_usable()
