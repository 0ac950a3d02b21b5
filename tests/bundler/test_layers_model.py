"""apply_layer against a small pure-Python model of image-spec layer semantics.

Hypothesis generates stacks of layers over a tiny path alphabet (so entries collide, replace
each other, hide each other and pass through each other's symlinks); the same stack is applied
with :func:`apply_layer` and with :class:`Model`, and the trees must be equal: names, types,
contents, symlink targets, modes (directories with u+rwx, rootless) and hardlink groups. When
the model says a layer is invalid (a hardlink to nothing, a file used as a directory, a symlink
loop), apply_layer must raise LayerError on that same layer.

The model is written from the spec, independently of ocistage.bundler.unpack.safepath: a dict from
path tuples to nodes; paths through symlinks are resolved as a chroot would, with a hop limit.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ocistage.bundler.unpack.apply import apply_layer
from ocistage.errors import LayerError
from tests.bundler.tarbuilder import (
    Entry,
    build_tar,
    directory,
    fifo,
    file,
    hardlink,
    opaque,
    symlink,
    whiteout,
)
from tests.owned import read_own_bytes

P = tuple[str, ...]


class Invalid(Exception):
    """The model's verdict: this layer cannot be applied."""


@dataclass(eq=False)
class Inode:
    kind: str  # "file", "symlink", "fifo"
    data: str
    mode: int


@dataclass
class Dir:
    mode: int
    live: int | None = None  # the mode on disk while a layer is applied (None: ``mode``)

    @property
    def current(self) -> int:
        return self.mode if self.live is None else self.live


Node = Inode | Dir


def lexical(base: P, path: str) -> P:
    parts = list(base) if not path.startswith("/") else []
    for component in path.split("/"):
        if component in ("", "."):
            continue
        if component == "..":
            if parts:
                parts.pop()
        else:
            parts.append(component)
    return tuple(parts)


class Model:
    def __init__(self) -> None:
        self.tree: dict[P, Node] = {(): Dir(0o755)}

    def children(self, path: P) -> list[P]:
        return [p for p in self.tree if len(p) == len(path) + 1 and p[:len(path)] == path]

    def remove(self, path: P) -> None:
        for p in [p for p in self.tree if p[:len(path)] == path]:
            del self.tree[p]

    def resolve_dir(self, path: P, create: bool, made: set[P]) -> P | None:
        todo, hops = list(path), 0
        done: P = ()
        while todo:
            name = todo.pop(0)
            here = (*done, name)
            node = self.tree.get(here)
            if node is None:
                if not create:
                    return None
                self.tree[here] = Dir(0o755 | self.inherited(done))
                made.add(here)
                node = self.tree[here]
            if isinstance(node, Inode) and node.kind == "symlink":
                hops += 1
                if hops > 40:
                    raise Invalid("loop")
                todo = list(lexical(done, node.data)) + todo
                done = ()
                continue
            if not isinstance(node, Dir):
                if create:
                    raise Invalid("not a directory")
                return None
            done = here
        return done

    def inherited(self, parent: P) -> int:
        """A directory made inside a setgid directory is setgid too (Linux; tar and umoci make
        missing parents the same way). Modes of a layer's directories are set at its end, so
        what counts is the parent's mode on disk at the time."""
        node = self.tree.get(parent)
        return node.current & stat.S_ISGID if isinstance(node, Dir) else 0

    def apply(self, entries: list[tuple[str, str, str, int]]) -> None:
        self._apply(entries)
        for node in self.tree.values():
            if isinstance(node, Dir):
                node.live = None

    def _apply(self, entries: list[tuple[str, str, str, int]]) -> None:
        created: set[P] = set()

        def mark(path: P) -> None:
            created.add(path)

        def made_by_layer(path: P) -> bool:
            return any(c[:len(path)] == path for c in created)

        def remove_lower(path: P) -> None:
            node = self.tree.get(path)
            if node is None:
                return
            if made_by_layer(path):
                if isinstance(node, Dir):
                    for child in self.children(path):
                        remove_lower(child)
                return
            self.remove(path)

        for kind, name, extra, mode in entries:
            parts = lexical((), name)
            if kind in ("whiteout", "opaque"):
                target = self.resolve_dir(parts if kind == "opaque" else parts[:-1], False, set())
                if target is None:
                    continue
                if kind == "opaque":
                    for child in self.children(target):
                        remove_lower(child)
                else:
                    remove_lower((*target, parts[-1]))
                continue
            made: set[P] = set()
            parent = self.resolve_dir(parts[:-1], True, made)
            created |= made
            assert parent is not None
            path = (*parent, parts[-1])
            existing = self.tree.get(path)
            if kind == "dir":
                if isinstance(existing, Dir):
                    existing.live = existing.current
                    existing.mode = mode | 0o700
                else:
                    self.remove(path)
                    self.tree[path] = Dir(mode | 0o700, live=0o700 | self.inherited(parent))
            elif kind == "hardlink":
                target = lexical((), extra)
                source_parent = self.resolve_dir(target[:-1], False, set()) if target else None
                if source_parent is None:
                    raise Invalid("hardlink to nothing")
                source = (*source_parent, target[-1])
                inode = self.tree.get(source)
                if inode is None or isinstance(inode, Dir):
                    raise Invalid("hardlink to nothing or to a directory")
                if source[:len(path)] == path and source != path:
                    raise Invalid("hardlink replacing the directory of its own target")
                if source != path:
                    self.remove(path)
                    self.tree[path] = inode
            else:
                self.remove(path)
                self.tree[path] = Inode(kind, extra, mode if kind != "symlink" else 0)
            mark(path)

    def snapshot(self) -> tuple[dict[str, tuple[str, str, int]], set[frozenset[str]]]:
        nodes: dict[str, tuple[str, str, int]] = {}
        groups: dict[int, set[str]] = {}
        for path, node in self.tree.items():
            if not path:
                continue
            name = "/".join(path)
            if isinstance(node, Dir):
                nodes[name] = ("dir", "", node.mode)
            else:
                nodes[name] = (node.kind, node.data, node.mode)
                groups.setdefault(id(node), set()).add(name)
        return nodes, {frozenset(g) for g in groups.values() if len(g) > 1}


def real_snapshot(root: Path) -> tuple[dict[str, tuple[str, str, int]], set[frozenset[str]]]:
    nodes: dict[str, tuple[str, str, int]] = {}
    groups: dict[int, set[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in dirnames + filenames:
            full = Path(dirpath) / entry
            name = str(full.relative_to(root))
            info = full.lstat()
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISDIR(info.st_mode):
                nodes[name] = ("dir", "", mode)
                continue
            if stat.S_ISLNK(info.st_mode):
                nodes[name] = ("symlink", os.readlink(full), 0)
            elif stat.S_ISFIFO(info.st_mode):
                nodes[name] = ("fifo", "", mode)
            else:
                nodes[name] = ("file", read_own_bytes(full).decode(), mode)
            groups.setdefault(info.st_ino, set()).add(name)
    return nodes, {frozenset(g) for g in groups.values() if len(g) > 1}


def to_entry(kind: str, name: str, extra: str, mode: int) -> Entry:
    if kind == "file":
        return file(name, extra.encode(), mode)
    if kind == "dir":
        return directory(name, mode)
    if kind == "symlink":
        return symlink(name, extra)
    if kind == "hardlink":
        return hardlink(name, extra)
    if kind == "fifo":
        return fifo(name, mode)
    if kind == "whiteout":
        return whiteout(name)
    return opaque(name)


PATHS = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3).map("/".join)
TARGETS = st.sampled_from(["a", "b", "/a", "../a", "a/b", "/", "..", "c/../a", "b/c", "/c/a"])
MODES = st.sampled_from([0o644, 0o755, 0o4755, 0o600, 0o000, 0o1777, 0o2711])
CONTENTS = st.sampled_from(["x", "y", ""])

ENTRY = st.one_of(
    st.tuples(st.just("file"), PATHS, CONTENTS, MODES),
    st.tuples(st.just("dir"), PATHS, st.just(""), MODES),
    st.tuples(st.just("symlink"), PATHS, TARGETS, st.just(0)),
    st.tuples(st.just("hardlink"), PATHS, PATHS, st.just(0)),
    st.tuples(st.just("fifo"), PATHS, st.just(""), MODES),
    st.tuples(st.just("whiteout"), PATHS, st.just(""), st.just(0)),
    st.tuples(st.just("opaque"), PATHS | st.just(""), st.just(""), st.just(0)),
)
STACKS = st.lists(st.lists(ENTRY, min_size=1, max_size=10), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STACKS)
def test_apply_layer_matches_the_model(stack: list[list[tuple[str, str, str, int]]]) -> None:
    model = Model()
    with tempfile.TemporaryDirectory() as scratch:
        rootfs = Path(scratch)
        for index, layer in enumerate(stack):
            try:
                model.apply(layer)
            except Invalid:
                try:
                    apply_layer(io.BytesIO(build_tar([to_entry(*e) for e in layer])), rootfs)
                except LayerError:
                    return
                raise AssertionError(f"layer {index} should have been refused") from None
            apply_layer(io.BytesIO(build_tar([to_entry(*e) for e in layer])), rootfs)
            assert real_snapshot(rootfs) == model.snapshot(), f"after layer {index}"


def test_model_catches_a_broken_whiteout_rule() -> None:
    """The comparison can fail: a same-layer whiteout deleting the entry is noticed."""
    model = Model()
    model.apply([("file", "a", "x", 0o644)])
    model.apply([("file", "a", "y", 0o644), ("whiteout", "a", "", 0)])
    with tempfile.TemporaryDirectory() as scratch:
        rootfs = Path(scratch)
        apply_layer(io.BytesIO(build_tar([file("a", b"x")])), rootfs)
        apply_layer(io.BytesIO(build_tar([whiteout("a")])), rootfs)  # a *different* stack
        assert real_snapshot(rootfs) != model.snapshot()
