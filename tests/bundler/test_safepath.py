from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ocistage.bundler.unpack.safepath import MAX_SYMLINK_HOPS, SafeRoot, join_link, normalize
from ocistage.cache.treeremoval import remove_at
from ocistage.errors import LayerError


@pytest.mark.parametrize("name,parts", [
    ("a/b", ("a", "b")),
    ("./a/./b/", ("a", "b")),
    ("/a//b", ("a", "b")),
    ("../x", ("x",)),
    ("/../../x", ("x",)),
    ("a/../../x", ("x",)),
    ("a/b/../c", ("a", "c")),
    ("..", ()),
    ("./", ()),
    ("", ()),
    ("...", ("...",)),
    (".wh..", (".wh..",)),
])
def test_normalize_clamps_at_root(name: str, parts: tuple[str, ...]) -> None:
    assert normalize(name) == parts


@given(st.lists(st.sampled_from(["", ".", "..", "a", "b.c", "...", ".wh.x", " "]), max_size=8))
def test_normalize_of_clean_names_is_the_general_rule(components: list[str]) -> None:
    """Names without empty, "." or ".." components are split as they are (the fast path);
    any other goes through the general rule: both give what the rule gives."""
    parts: list[str] = []
    for component in components:
        if component == "..":
            if parts:
                parts.pop()
        elif component not in ("", "."):
            parts.append(component)
    assert normalize("/".join(components)) == tuple(parts)


def test_normalize_rejects_nul() -> None:
    with pytest.raises(LayerError, match="NUL"):
        normalize("a\x00b")


def test_join_link_is_chroot_style() -> None:
    assert join_link(("usr", "lib"), "../share") == ("usr", "share")
    assert join_link(("usr", "lib"), "/etc") == ("etc",)
    assert join_link(("usr",), "../../../../tmp") == ("tmp",)
    assert join_link((), "/") == ()


def inode(path: Path) -> int:
    return path.stat().st_ino


def resolved(root: SafeRoot, path: str, create: bool = False,
             follow: bool = True) -> tuple[str, ...] | None:
    found = root.resolve_dir(normalize(path), create=create, follow=follow)
    if found is None:
        return None
    fd, parts = found
    assert os.fstat(fd).st_ino == inode(root.root.joinpath(*parts))
    return parts


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("x")
    (tmp_path / "outside").mkdir()
    os.symlink("/", root / "slash")
    os.symlink("..", root / "usr" / "up")
    os.symlink("/usr/lib", root / "abs")
    os.symlink("../usr/lib", root / "usr" / "rel")
    os.symlink(str(tmp_path / "outside"), root / "host")
    os.symlink("loop2", root / "loop1")
    os.symlink("loop1", root / "loop2")
    os.symlink("etc/passwd", root / "tofile")
    return root


def test_symlinked_parents_resolve_inside_root(tree: Path) -> None:
    with SafeRoot(tree) as root:
        assert resolved(root, "slash/usr") == ("usr",)
        assert resolved(root, "usr/up/usr/up/etc") == ("etc",)
        assert resolved(root, "abs") == ("usr", "lib")
        assert resolved(root, "usr/rel") == ("usr", "lib")
        assert resolved(root, "host", create=True) == (*tree.parent.parts[1:], "outside")
    # the absolute host path was re-created *inside* the root, the real one is untouched
    assert (tree / tree.parent.relative_to("/") / "outside").is_dir()
    assert list((tree.parent / "outside").iterdir()) == []


def test_missing_and_non_directories(tree: Path) -> None:
    with SafeRoot(tree) as root:
        assert resolved(root, "nope/deeper") is None
        assert resolved(root, "etc/passwd") is None
        assert resolved(root, "tofile") is None
        with pytest.raises(LayerError, match="not a directory"):
            root.resolve_dir(("etc", "passwd", "x"), create=True)
        created: list[tuple[str, ...]] = []
        assert root.resolve_dir(("new", "deep"), create=True, on_create=created.append)
        assert created == [("new",), ("new", "deep")]


def test_symlink_loops_are_an_error(tree: Path) -> None:
    with SafeRoot(tree) as root, pytest.raises(LayerError, match="symbolic links"):
        root.resolve_dir(("loop1", "x"))
    chain = tree / "chain"
    chain.mkdir()
    for i in range(MAX_SYMLINK_HOPS):
        os.symlink(f"c{i + 1}", chain / f"c{i}")
    (chain / f"c{MAX_SYMLINK_HOPS}").mkdir()
    with SafeRoot(tree) as root:
        assert resolved(root, "chain/c0") == ("chain", f"c{MAX_SYMLINK_HOPS}")
    os.symlink("c0", chain / "c-1")
    with SafeRoot(tree) as root, pytest.raises(LayerError, match="symbolic links"):
        root.resolve_dir(("chain", "c-1"))


def test_no_follow_mode(tree: Path) -> None:
    with SafeRoot(tree) as root:
        assert resolved(root, "usr/lib", follow=False) == ("usr", "lib")
        assert resolved(root, "abs", follow=False) is None


def test_repeated_lookups_share_a_descriptor_until_invalidated(tree: Path) -> None:
    """The same directory twice in a row is the same descriptor (the last lookup is not
    looked up again); after invalidate() it is resolved again, as any other."""
    with SafeRoot(tree, cache_size=4) as root:
        assert root.resolve_dir(()) == root.resolve_dir(()) == (root.root_fd, ())
        first = root.resolve_dir(("usr", "lib"))
        assert first is not None
        again = root.resolve_dir(("usr", "lib"))
        assert again == first
        root.invalidate()
        os.rename(tree / "usr" / "lib", tree / "usr" / "lib.old")
        os.symlink("/etc", tree / "usr" / "lib")
        assert resolved(root, "usr/lib") == ("etc",)
        assert resolved(root, "usr/lib") == ("etc",)
        for n in range(8):  # evicts the others; the last one stays usable
            (tree / f"d{n}").mkdir()
            assert resolved(root, f"d{n}") == (f"d{n}",)
            found = root.resolve_dir((f"d{n}",))
            assert found is not None
            assert os.stat(found[0]).st_ino == (tree / f"d{n}").stat().st_ino


def test_cache_invalidation_sees_replaced_directories(tree: Path) -> None:
    with SafeRoot(tree) as root:
        assert resolved(root, "usr/lib") == ("usr", "lib")
        fd = root.resolve_dir(("usr",))
        assert fd is not None
        remove_at(fd[0], "lib")
        root.invalidate()
        os.symlink("/etc", tree / "usr" / "lib")
        assert resolved(root, "usr/lib") == ("etc",)
