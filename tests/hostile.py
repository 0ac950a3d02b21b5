"""Hostile strings for property tests (hypothesis): one vocabulary for every test that feeds
data from image configs, references and user options into something with syntax (a command
line, a shell word, Lua, oci.conf, TOML, JSON, roff; docs/trust.md, "Data that becomes
syntax").

The API is four strategies; each draws ``str`` (non-UTF-8 bytes as ``surrogateescape``
surrogates, as Python decodes argv, environment and file names) unless it says bytes:

``hostile_text(exclude=())``
    one piece of :data:`CLASSES` alone, or two to four (of any classes) combined with plain
    text between them; ``exclude`` names classes a caller cannot be given at all (``"nul"``
    where the input is an argv word or a path).
``hostile_bytes(exclude=())``
    the same as bytes, plus raw invalid UTF-8, for inputs that are bytes.
``benign(kind)``
    a plain value of ``kind`` (:data:`KINDS`): what a test compares the structure against.
``hostile(kind, exclude=())``
    a value of ``kind`` with hostile text spliced in front, in the middle or at the end (or
    only hostile text), so that a builder's first check (an absolute path, a NAME=value) does
    not turn every example away before the interesting part.

A property test renders a benign value and a hostile one and asserts that what comes out has
the same structure (the same options in the same places, the same keys, the same number of
words or lines), or that the hostile value is refused with the project's typed error.
"""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import strategies as st

#: the classes of hostile text, by name: each a list of pieces
CLASSES: dict[str, tuple[str, ...]] = {
    "whitespace": (" ", "\t", "  two  spaces ", "\v", "\f", "\xa0", "\u2028"),
    "quotes": ('"', "'", "`", '\\"', "\\'", "'\"'\"'", '""', "''"),
    "hash": ("#", " # comment", "\\#", "##"),
    "semicolon": (";", ";id;", " ; rm -rf ~ ; ", "&&", "|", "&", "$(id)", "`id`", "$HOME",
                  "${IFS}", ">out", "<in", "*", "?", "[a]", "{a,b}", "~", "!"),
    "newline": ("\n", "\r\n", "\r", "\nnext line", "\n#SBATCH --output=/tmp/x\n",
                "\n.SH EVIL\n", "\nKey=value\n"),
    "dash": ("-", "--", "-x", "--output=/tmp/pwned", "--help", "-p"),
    "nul": ("\0", "a\0b"),
    "non_utf8": ("\udcff", "\udc80\udcfe", "caf\udce9", "\udcc3("),
    "long": ("x" * 4096, "\xe9" * 4096),
    # what one of the formats here gives meaning to: Slurm % patterns, template markers, Lua
    # long brackets and comments, backslashes, roff requests
    "syntax": ("%", "%%", "%x", "%p", "%@", "@CACHE@", "@STAGE_DIR@", "@OCISTAGE@", "]]",
               "--[[", "\\", "\\\\", "\\n", "{", "}", ":", "=", ".", "'br", ".TH X",
               "\\fB", "\\e"),
}
#: the kinds of value :func:`benign` and :func:`hostile` draw
KINDS = ("path", "reference", "option", "word", "env_name", "env_value")

_PLAIN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1,
                 max_size=8).filter(lambda s: s not in (".", ".."))


def _classes(exclude: Iterable[str]) -> list[str]:
    excluded = set(exclude)
    unknown = excluded - set(CLASSES)
    if unknown:
        raise ValueError(f"unknown hostile classes {sorted(unknown)}")
    return [name for name in CLASSES if name not in excluded]


def _piece(exclude: Iterable[str]) -> st.SearchStrategy[str]:
    return st.sampled_from(_classes(exclude)).flatmap(lambda name: st.sampled_from(
        CLASSES[name]))


def hostile_text(exclude: Iterable[str] = ()) -> st.SearchStrategy[str]:
    """One hostile piece alone, or several combined with plain text between them."""
    excluded = tuple(exclude)
    piece = _piece(excluded)
    combined = st.lists(st.one_of(piece, _PLAIN), min_size=2, max_size=5).map("".join)
    return st.one_of(piece, combined).filter(lambda s: any(
        not c.isalnum() and c not in "_." for c in s) or len(s) >= 4096)


def hostile_bytes(exclude: Iterable[str] = ()) -> st.SearchStrategy[bytes]:
    """:func:`hostile_text` as bytes (surrogates back to the bytes they stand for), and raw
    invalid UTF-8."""
    raw = st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80abc", b"\xfe\xfe"])
    text = hostile_text(exclude).map(lambda s: s.encode("utf-8", "surrogateescape"))
    return st.one_of(text, raw)


def benign(kind: str) -> st.SearchStrategy[str]:
    """A plain value of ``kind`` (:data:`KINDS`)."""
    if kind == "path":
        return st.lists(_PLAIN, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
    if kind == "reference":
        return st.tuples(_PLAIN, _PLAIN, _PLAIN).map(
            lambda t: f"registry.example:5000/{t[0]}/{t[1]}:{t[2]}".replace("-:", "x:"))
    if kind in ("option", "word", "env_value"):
        return st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.:/", min_size=1,
                       max_size=12)
    if kind == "env_name":
        return st.from_regex(r"\A[A-Z][A-Z0-9_]{0,11}\Z")
    raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")


def hostile(kind: str, exclude: Iterable[str] = ()) -> st.SearchStrategy[str]:
    """A value of ``kind`` with hostile text in front, in the middle, at the end, or alone."""
    excluded = tuple(exclude)
    bad = hostile_text(excluded)
    plain = benign(kind)

    def splice(parts: tuple[str, str, int]) -> str:
        value, text, where = parts
        if where == 0:
            return text
        if where == 1:
            return value + text
        if where == 2:
            middle = len(value) // 2 or 1
            return value[:middle] + text + value[middle:]
        return text + value

    return st.tuples(plain, bad, st.integers(0, 3)).map(splice)
