"""Platforms: parsing, normalisation, the host platform and choosing among candidates."""

from __future__ import annotations

import pytest

from ocistage.bundler.image.platform import (
    Platform,
    host_platform,
    normalize_architecture,
    select_platform,
)
from ocistage.errors import UsageError


@pytest.mark.parametrize(("text", "expected"), [
    ("linux/amd64", Platform("linux", "amd64")),
    ("linux/x86_64", Platform("linux", "amd64")),
    ("linux/amd64/v1", Platform("linux", "amd64")),
    ("linux/amd64/v3", Platform("linux", "amd64", "v3")),
    ("linux/arm64", Platform("linux", "arm64")),
    ("linux/aarch64", Platform("linux", "arm64")),
    ("linux/arm64/v8", Platform("linux", "arm64", "v8")),
    ("linux/arm64/8", Platform("linux", "arm64", "v8")),
    ("linux/arm", Platform("linux", "arm", "v7")),
    ("linux/arm/v6", Platform("linux", "arm", "v6")),
    ("linux/arm/7", Platform("linux", "arm", "v7")),
    ("linux/armhf", Platform("linux", "arm", "v7")),
    ("linux/armel", Platform("linux", "arm", "v6")),
    ("linux/i386", Platform("linux", "386")),
    ("Linux/PPC64LE", Platform("linux", "ppc64le")),
    ("linux/s390x", Platform("linux", "s390x")),
    ("linux/riscv64", Platform("linux", "riscv64")),
    ("windows/amd64", Platform("windows", "amd64")),
])
def test_parse(text: str, expected: Platform) -> None:
    assert Platform.parse(text) == expected


@pytest.mark.parametrize("text", [
    "", "linux", "linux/", "/amd64", "linux/amd64/v8/x", "linux//v8", "linux/amd 64",
    "linux/amd64/", "linux/../amd64", "linux/-amd64",
])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="invalid platform") as info:
        Platform.parse(text)
    assert info.value.exit_code == 2
    assert "os/arch" in (info.value.hint or "")


def test_str() -> None:
    assert str(Platform("linux", "arm64", "v8")) == "linux/arm64/v8"
    assert str(Platform("linux", "amd64")) == "linux/amd64"
    assert str(Platform.parse("linux/arm")) == "linux/arm/v7"


def test_normalize_architecture() -> None:
    assert normalize_architecture("x86-64", "v1") == ("amd64", None)
    assert normalize_architecture("aarch64", "v8.0") == ("arm64", "v8")
    assert normalize_architecture("arm64", "9") == ("arm64", "v9")
    assert normalize_architecture("mips64le", None) == ("mips64le", None)
    assert Platform("Linux", "AArch64", "8").normalized() == Platform("linux", "arm64", "v8")


@pytest.mark.parametrize(("machine", "expected"), [
    ("x86_64", "linux/amd64"),
    ("aarch64", "linux/arm64/v8"),
    ("arm64", "linux/arm64/v8"),
    ("armv7l", "linux/arm/v7"),
    ("armv6l", "linux/arm/v6"),
    ("ppc64le", "linux/ppc64le"),
    ("s390x", "linux/s390x"),
    ("riscv64", "linux/riscv64"),
    ("i686", "linux/386"),
    ("i386", "linux/386"),
])
def test_host_platform(machine: str, expected: str) -> None:
    assert str(host_platform(machine)) == expected


def test_host_platform_of_this_machine() -> None:
    import platform as stdlib_platform

    host = host_platform()
    assert host.os == "linux"
    assert host == host_platform(stdlib_platform.machine())


def test_host_platform_unknown_machine() -> None:
    with pytest.raises(UsageError, match="unknown machine") as info:
        host_platform("pdp11")
    assert "--platform" in (info.value.hint or "")


P = Platform.parse


def _pick(candidates: list[str], wanted: str) -> str | None:
    parsed = [_candidate(text) for text in candidates]
    index = select_platform(parsed, _candidate(wanted))
    return None if index is None else candidates[index]


def _candidate(text: str) -> Platform:
    """Like an index entry: no defaulting of missing variants."""
    parts = text.split("/")
    return Platform(parts[0], parts[1], parts[2] if len(parts) > 2 else None)


@pytest.mark.parametrize(("candidates", "wanted", "expected"), [
    # exact matches win
    (["linux/amd64", "linux/arm64/v8"], "linux/amd64", "linux/amd64"),
    (["linux/amd64", "linux/arm64/v8"], "linux/arm64/v8", "linux/arm64/v8"),
    (["linux/ppc64le", "linux/s390x"], "linux/s390x", "linux/s390x"),
    # os must match
    (["windows/amd64"], "linux/amd64", None),
    (["linux/amd64"], "windows/amd64", None),
    # arm64: no variant is v8 both ways
    (["linux/arm64"], "linux/arm64/v8", "linux/arm64"),
    (["linux/arm64/v8"], "linux/arm64", "linux/arm64/v8"),
    (["linux/aarch64/8"], "linux/arm64", "linux/aarch64/8"),
    # arm64 v9 machine runs v8 images, prefers v9
    (["linux/arm64/v8", "linux/arm64/v9"], "linux/arm64/v9", "linux/arm64/v9"),
    (["linux/arm64"], "linux/arm64/v9", "linux/arm64"),
    (["linux/arm64/v9"], "linux/arm64/v8", None),
    (["linux/arm64/v8", "linux/arm64/v8.2"], "linux/arm64/v9", "linux/arm64/v8.2"),
    # arm: best lower variant
    (["linux/arm/v5", "linux/arm/v6", "linux/arm/v7"], "linux/arm/v7", "linux/arm/v7"),
    (["linux/arm/v5", "linux/arm/v6"], "linux/arm/v7", "linux/arm/v6"),
    (["linux/arm/v6", "linux/arm/v5"], "linux/arm/v7", "linux/arm/v6"),
    (["linux/arm/v7"], "linux/arm/v6", None),
    (["linux/arm/v8", "linux/arm/v7"], "linux/arm/v7", "linux/arm/v7"),
    (["linux/arm", "linux/arm/v5"], "linux/arm/v7", "linux/arm/v5"),
    (["linux/arm"], "linux/arm/v6", "linux/arm"),
    # arm and arm64 are different architectures
    (["linux/arm/v7"], "linux/arm64", None),
    (["linux/arm64"], "linux/arm/v7", None),
    # amd64 levels
    (["linux/amd64/v3", "linux/amd64"], "linux/amd64", "linux/amd64"),
    (["linux/amd64/v3", "linux/amd64/v2"], "linux/amd64", "linux/amd64/v2"),
    (["linux/amd64/v2", "linux/amd64/v3"], "linux/amd64/v3", "linux/amd64/v3"),
    (["linux/amd64", "linux/amd64/v2"], "linux/amd64/v3", "linux/amd64/v2"),
    (["linux/amd64/v4"], "linux/amd64/v2", None),
    (["linux/amd64/v1"], "linux/amd64", "linux/amd64/v1"),
    (["linux/x86_64"], "linux/amd64", "linux/x86_64"),
    # other architectures: exact variant first, then an unspecified one
    (["linux/ppc64le", "linux/ppc64le/power9"], "linux/ppc64le/power9", "linux/ppc64le/power9"),
    (["linux/ppc64le"], "linux/ppc64le/power9", "linux/ppc64le"),
    (["linux/ppc64le/power10"], "linux/ppc64le/power9", None),
    # ties go to the first candidate; nothing to choose from
    (["linux/amd64", "linux/amd64"], "linux/amd64", "linux/amd64"),
    ([], "linux/amd64", None),
    # attestation-like entries never match
    (["unknown/unknown"], "linux/amd64", None),
])
def test_select_platform(candidates: list[str], wanted: str, expected: str | None) -> None:
    assert _pick(candidates, wanted) == expected


def test_select_platform_returns_first_of_equals() -> None:
    candidates = [P("linux/amd64"), P("linux/arm64"), P("linux/amd64")]
    assert select_platform(candidates, P("linux/amd64")) == 0


def test_select_platform_prefers_matching_os_version() -> None:
    candidates = [Platform("windows", "amd64", os_version="10.0.17763.1"),
                  Platform("windows", "amd64", os_version="10.0.20348.1")]
    wanted = Platform("windows", "amd64", os_version="10.0.20348.1")
    assert select_platform(candidates, wanted) == 1
    assert select_platform(candidates, Platform("windows", "amd64")) == 0
