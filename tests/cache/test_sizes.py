"""Sizes and ages as users type them: powers of 1024, s/m/h/d/w; anything else is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ocistage.bundler.settings import load_settings
from ocistage.cache.sizes import format_age, format_size, parse_age, parse_size
from ocistage.errors import UsageError


@pytest.mark.parametrize(("text", "expected"), [
    ("0", 0), ("4096", 4096), ("1K", 1024), ("1k", 1024), ("1KB", 1024), ("1KiB", 1024),
    ("500M", 500 << 20), ("20G", 20 << 30), ("1.5T", int(1.5 * (1 << 40))), ("2P", 2 << 50),
    (" 10 G ", 10 << 30), (".5G", 512 << 20), ("7B", 7),
])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "-1G", "1X", "1.2.3M", "10 GB extra", "1e3",
                                  "nan", "inf", "1GiBs"])
def test_parse_size_refuses_garbage(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_size(text)
    assert info.value.hint and "500M" in info.value.hint


@pytest.mark.parametrize(("text", "expected"), [
    ("90", 90), ("45s", 45), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("2w", 1209600),
    ("1.5h", 5400), ("0", 0),
])
def test_parse_age(text: str, expected: float) -> None:
    assert parse_age(text) == expected


@pytest.mark.parametrize("text", ["", "d", "-1d", "1y", "10 minutes", "1M"])
def test_parse_age_refuses_garbage(text: str) -> None:
    with pytest.raises(UsageError):
        parse_age(text)


@given(st.integers(min_value=0, max_value=1 << 52))
def test_formatted_sizes_parse_back_within_rounding(n: int) -> None:
    text = format_size(n).replace(" ", "")
    parsed = parse_size(text)
    assert abs(parsed - n) <= max(1, n) * 0.05 + 1024


def test_format_age_uses_the_coarsest_unit() -> None:
    assert [format_age(s) for s in (5, 125, 7200, 3 * 86400 + 5)] == ["5s", "2m", "2h", "3d"]


def test_max_size_setting_comes_from_option_env_or_config_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    config.write_text('max_size = "1.5G"\n')
    monkeypatch.setenv("OCISTAGE_CONFIG", str(config))
    monkeypatch.delenv("OCISTAGE_MAX_SIZE", raising=False)
    assert load_settings(cache=tmp_path).max_size == int(1.5 * (1 << 30))
    monkeypatch.setenv("OCISTAGE_MAX_SIZE", "20G")
    assert load_settings(cache=tmp_path).max_size == 20 << 30
    assert load_settings(cache=tmp_path, max_size="500M").max_size == 500 << 20
    config.write_text("")
    monkeypatch.delenv("OCISTAGE_MAX_SIZE")
    assert load_settings(cache=tmp_path).max_size is None
    config.write_text('max_size = "big"\n')
    with pytest.raises(UsageError, match="`max_size` must be a size"):
        load_settings(cache=tmp_path)
