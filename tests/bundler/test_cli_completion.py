"""Shell completion of option values and of cached references, as bash asks for it (the
protocol of the script ``ocistage --show-completion bash`` prints: ``COMP_WORDS``,
``COMP_CWORD``, ``_OCISTAGE_COMPLETE=complete_bash``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.pull import pull
from ocistage.cache.store import Store
from tests.bundler.tarbuilder import build_tar, file, write_oci_layout


def _complete(words: str, env: dict[str, str] | None = None) -> list[str]:
    parts = words.split(" ")
    result = subprocess.run(
        [sys.executable, "-m", "ocistage"], capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {}), "COMP_WORDS": words,
             "COMP_CWORD": str(len(parts) - 1), "_OCISTAGE_COMPLETE": "complete_bash"},
        check=False)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize(("words", "expected"), [
    ("ocistage stage --format ", ["dir", "squashfs"]),
    ("ocistage pull --pull ", ["always", "missing", "never"]),
    ("ocistage bundle --pull m", ["missing"]),
    ("ocistage pull --platform linux/arm6", ["linux/arm64", "linux/arm64/v8"]),
    ("ocistage runtime oci-conf --runtime cr", ["crun"]),
    ("ocistage runtime scrun-lua --stage-to n", ["node-local"]),
    ("ocistage cache rm x --platform linux/s", ["linux/s390x"]),
])
def test_option_values_complete(words: str, expected: list[str]) -> None:
    assert _complete(words) == expected


def test_references_complete_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    names = []
    for tag in ("v1", "v2"):
        layout = tmp_path / f"image-{tag}"
        write_oci_layout(layout, [build_tar([file("f", tag.encode())])], tag=tag)
        names.append(f"oci:{layout}:{tag}")
        pull(parse_reference(names[-1]), Store.open(cache))
    env = {"OCISTAGE_CACHE": str(cache), "OCISTAGE_CONFIG": str(tmp_path / "none.toml")}
    assert _complete("ocistage cache rm oci:", env) == names
    assert _complete(f"ocistage stage {names[1][:-1]}", env) == [names[1]]
    other = {**env, "OCISTAGE_CACHE": str(tmp_path / "empty")}
    assert _complete(f"ocistage bundle --cache {cache} oci:", other) == names
    assert _complete("ocistage pull oci:", other) in ([], [""])  # no cache there: no error
