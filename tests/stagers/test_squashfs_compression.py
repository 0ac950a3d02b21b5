"""A squashfs compression as a setting names it (``ocistage.stagers.squashfs_compression``): what
parses, what is refused, and that the level reaches the image the real mksquashfs writes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ocistage.stagers.squashfs_compression import LEVELS, Compression
from pytest_ocistage.components import require_binary

LEVELLED = [(name, levels) for name, levels in LEVELS.items() if levels is not None]


@given(st.sampled_from(LEVELLED).flatmap(
    lambda pair: st.tuples(st.just(pair[0]), st.sampled_from(list(pair[1])))))
def test_every_level_in_range_parses_back_and_becomes_its_options(pair: tuple[str, int]) -> None:
    name, level = pair
    compression = Compression.parse(f"{name}:{level}")
    assert compression == Compression(name, level)
    assert Compression.parse(str(compression)) == compression
    assert compression.options() == ["-comp", name, "-Xcompression-level", str(level)]


@pytest.mark.parametrize("name", sorted(LEVELS))
def test_a_compressor_alone_takes_its_own_default(name: str) -> None:
    assert Compression.parse(name) == Compression(name)
    assert Compression(name).options() == ["-comp", name]


@pytest.mark.parametrize("text", [
    "zstd:0", "zstd:23", "gzip:10", "gzip:0", "lz4:1", "xz:6", "lzo:9", "zstd:", "zstd:-1",
    "zstd:+3", "zstd:3.5", "zstd:\u0663", "zstd:\uff13", "ZSTD:3", "zstd :3", "zstd:3:4", "lzma",
    "", ":3", "-comp", "zstd -Xhc", "zstd:3 -e x", "zstd\n", "zstd:3\0"])
def test_anything_else_is_refused(text: str) -> None:
    assert Compression.parse(text) is None


@given(st.text())
def test_no_text_reaches_the_options_but_a_known_name_and_a_number(text: str) -> None:
    """Whatever a setting says, the options are a known compressor and a level in its range:
    nothing of the text becomes an option of its own."""
    compression = Compression.parse(text)
    if compression is None:
        return
    options = compression.options()
    assert options[:2] == ["-comp", compression.compressor]
    assert compression.compressor in LEVELS
    if compression.level is not None:
        assert options[2] == "-Xcompression-level"
        assert re.fullmatch(r"[0-9]+", options[3])
        levels = LEVELS[compression.compressor]
        assert levels is not None and int(options[3]) in levels


@pytest.mark.parametrize("setting", ["zstd:1", "zstd:3", "zstd:19", "gzip:1", "lz4", "xz"])
def test_the_real_mksquashfs_writes_the_compression_asked_for(setting: str,
                                                             tmp_path: Path) -> None:
    mksquashfs = require_binary("mksquashfs", "squashfs-tools")
    unsquashfs = require_binary("unsquashfs", "squashfs-tools")
    compression = Compression.parse(setting)
    assert compression is not None
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "file").write_bytes(b"text " * 10_000)
    image = tmp_path / "image.sqsh"
    subprocess.run([mksquashfs, str(tmp_path / "tree"), str(image), "-noappend", "-quiet",
                    "-no-progress", *compression.options()], check=True, capture_output=True,
                   timeout=120)
    said = subprocess.run([unsquashfs, "-s", str(image)], check=True, capture_output=True,
                          text=True, timeout=60).stdout
    assert f"Compression {compression.compressor}\n" in said
    if compression.level is not None:  # unsquashfs says a level (gzip's only when not 9)
        assert f"compression-level {compression.level}\n" in said
