"""Scratch directories with an owner file beside them until released or dropped."""

from __future__ import annotations

from pathlib import Path

from ocistage.cache.owneddirs import drop_owned_dir, make_owned_dir, owner_file, release_owned_dir


def test_owned_dirs_carry_an_owner_file_until_released_or_dropped(tmp_path: Path) -> None:
    kept = make_owned_dir(tmp_path / "kept")
    assert owner_file(kept).read_text().startswith("{")
    release_owned_dir(kept)
    assert kept.is_dir() and not owner_file(kept).exists()
    dropped = make_owned_dir(tmp_path / "dropped")
    (dropped / "f").write_text("x")
    drop_owned_dir(dropped)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
