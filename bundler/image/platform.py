"""Platforms (``os/architecture[/variant]``): parsing, the host's platform, and matching.

Names are normalised as containerd's ``platforms`` package does (``x86_64`` is ``amd64``,
``aarch64`` is ``arm64``, ``armhf`` is ``arm/v7``, ``8`` is ``v8``). Matching knows which
variants a machine can run:

- ``arm64``: no variant means ``v8``; a ``v9`` (or ``v8.2``) machine also runs older variants.
- ``arm``: a ``v7`` machine runs ``v7``, then ``v6``, then ``v5``; no variant means ``v7``
  when parsing and "unknown, try last" when matching.
- ``amd64``: levels ``v1``..``v4``; no variant means ``v1``. A machine of level N runs levels
  up to N; when the wanted platform gives no level, all levels are accepted, lowest first.
"""

from __future__ import annotations

import platform as _stdlib_platform
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ocistage.errors import UsageError

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*", re.ASCII)
_ARM_VARIANT_RE = re.compile(r"v(\d+)(?:\.(\d+))?", re.ASCII)

# machine (uname -m) -> (architecture, variant)
_MACHINES: dict[str, tuple[str, str | None]] = {
    "x86_64": ("amd64", None),
    "amd64": ("amd64", None),
    "i386": ("386", None),
    "i486": ("386", None),
    "i586": ("386", None),
    "i686": ("386", None),
    "aarch64": ("arm64", "v8"),
    "arm64": ("arm64", "v8"),
    "armv8l": ("arm", "v7"),  # 32-bit userland on a 64-bit ARM kernel
    "armv7l": ("arm", "v7"),
    "armv7": ("arm", "v7"),
    "armv6l": ("arm", "v6"),
    "armv5tel": ("arm", "v5"),
    "armv5tejl": ("arm", "v5"),
    "ppc64le": ("ppc64le", None),
    "ppc64": ("ppc64", None),
    "s390x": ("s390x", None),
    "riscv64": ("riscv64", None),
    "mips64": ("mips64", None),
    "mips64el": ("mips64le", None),
    "loongarch64": ("loong64", None),
}


@dataclass(frozen=True)
class Platform:
    """A platform as in an image index entry or an image config."""

    os: str
    architecture: str
    variant: str | None = None
    os_version: str | None = None
    os_features: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Platform:
        """``os/arch[/variant]`` (e.g. ``linux/arm64/v8``), normalised; raises UsageError."""
        parts = text.strip().lower().split("/")
        if len(parts) not in (2, 3) or not all(_NAME_RE.fullmatch(part) for part in parts):
            raise UsageError(f"invalid platform {text!r}",
                             "platforms look like os/arch[/variant], e.g. linux/amd64 or "
                             "linux/arm64/v8")
        os_name, architecture, variant = parts[0], parts[1], parts[2] if len(parts) == 3 else None
        architecture, variant = normalize_architecture(architecture, variant)
        if architecture == "arm" and variant is None:
            variant = "v7"
        return cls(os_name, architecture, variant)

    def normalized(self) -> Platform:
        """The same platform with architecture and variant spelt canonically."""
        architecture, variant = normalize_architecture(self.architecture, self.variant)
        return Platform(self.os.lower(), architecture, variant, self.os_version, self.os_features)

    def __str__(self) -> str:
        text = f"{self.os}/{self.architecture}"
        return f"{text}/{self.variant}" if self.variant else text


def normalize_architecture(architecture: str, variant: str | None) -> tuple[str, str | None]:
    """Canonical (architecture, variant), as containerd spells them."""
    arch = architecture.lower()
    var = variant.lower() if variant else None
    if arch in ("x86_64", "x86-64", "amd64"):
        return "amd64", (None if var == "v1" else var)
    if arch in ("i386", "i686", "386"):
        return "386", var
    if arch in ("aarch64", "arm64"):
        if var in ("8", "v8", "v8.0"):
            var = "v8"
        elif var in ("9", "v9", "9.0", "v9.0"):
            var = "v9"
        return "arm64", var
    if arch == "armhf":
        return "arm", "v7"
    if arch == "armel":
        return "arm", "v6"
    if arch == "arm":
        if var is not None and var.isdigit():
            var = f"v{var}"
        return "arm", var
    return arch, var


def host_platform(machine: str | None = None) -> Platform:
    """The platform of this machine (``machine`` overrides ``platform.machine()``)."""
    name = (machine if machine is not None else _stdlib_platform.machine()).lower()
    known = _MACHINES.get(name)
    if known is None:
        raise UsageError(f"unknown machine type {name!r}",
                         "pass --platform os/arch[/variant] explicitly")
    return Platform("linux", known[0], known[1])


def select_platform(candidates: Sequence[Platform], wanted: Platform) -> int | None:
    """Index of the candidate that best runs on ``wanted``, or ``None`` if none can.

    Exact matches win; then compatible variants in order of preference. Ties go to the
    earliest candidate.
    """
    want = wanted.normalized()
    best: tuple[tuple[int, ...], int] | None = None
    for index, candidate in enumerate(candidates):
        rank = _rank(candidate.normalized(), want)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, index)
    return None if best is None else best[1]


def _rank(candidate: Platform, want: Platform) -> tuple[int, ...] | None:
    """Lower is better; ``None``: cannot run."""
    if candidate.os != want.os or candidate.architecture != want.architecture:
        return None
    variant_rank = _variant_rank(want.architecture, candidate.variant, want.variant)
    if variant_rank is None:
        return None
    version_rank = 0 if want.os_version is None or candidate.os_version == want.os_version else 1
    return (*variant_rank, version_rank)


def _variant_rank(arch: str, have: str | None, want: str | None) -> tuple[int, ...] | None:
    if arch == "arm64":
        return _level_rank(_level(have, (8, 0)), _level(want, (8, 0)), any_level=False)
    if arch == "arm":
        if have is None:
            return (1, 0, 0)  # unknown level: after every known compatible one
        return _level_rank(_level(have, None), _level(want, (7, 0)), any_level=False)
    if arch == "amd64":
        return _level_rank(_level(have, (1, 0)), _level(want, None), any_level=want is None)
    if have == want:
        return (0, 0, 0)
    if have is None or want is None:
        return (1, 0, 0)
    return None


def _level(variant: str | None, default: tuple[int, int] | None) -> tuple[int, int] | None:
    if variant is None:
        return default
    match = _ARM_VARIANT_RE.fullmatch(variant)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2) or 0)


def _level_rank(have: tuple[int, int] | None, want: tuple[int, int] | None,
                any_level: bool) -> tuple[int, ...] | None:
    """Rank of level ``have`` on a machine of level ``want`` (newest runnable first)."""
    if any_level:
        if have is None:
            return None
        return (0, have[0], have[1])  # wanted level unknown: the lowest level is the safest
    if have is None or want is None or have > want:
        return None
    return (0, -have[0], -have[1])
