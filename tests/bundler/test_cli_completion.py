"""Shell completion of option values and of cached references, as bash asks for it (the
protocol of the script ``ocistage --show-completion bash`` prints: ``COMP_WORDS``,
``COMP_CWORD``, ``_OCISTAGE_COMPLETE=complete_bash``)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ocistage.bundler.cli.app import run
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.pull import pull
from ocistage.cache.refnames import record
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


# -- a hostile cache: what it holds is offered only when a shell can take it as it is ----------

DIGEST = "sha256:" + "ab" * 32


def _write_index(cache: Path, names: list[str]) -> None:
    cache.mkdir(mode=0o700, exist_ok=True)
    descriptor = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                  "digest": DIGEST, "size": 1}
    (cache / "index.json").write_text(json.dumps(
        {"schemaVersion": 2, "manifests": [record(name, descriptor) for name in names]}))


def test_a_fifo_at_the_index_does_not_block_completion(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.mkfifo(cache / "index.json")
    env = {"OCISTAGE_CACHE": str(cache), "OCISTAGE_CONFIG": str(tmp_path / "none.toml")}
    # before: the completion waited for a writer until this timeout (subprocess.TimeoutExpired)
    assert _complete("ocistage stage oci:", env) in ([], [""])


def test_references_with_control_characters_or_shell_syntax_are_not_offered(
        tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    plain = ["oci:/images/app:v1", "registry.example/team/app:v2@" + DIGEST]
    hostile = ["oci:/x\x1b]0;pwned\x07:v1", "oci:/x\nrm -rf ~:v1", "oci:/x\x07:v1",
               "oci:/x y:v1", "oci:/x\t:v1", "oci:/x\x9b31m:v1", "oci:/x\x7f:v1",
               "oci:/x\u202e:v1", "oci:/x$(id):v1", "oci:/x;id:v1", "oci:/x`id`:v1",
               "oci:/x*:v1", "oci:/x\u2028:v1"]
    _write_index(cache, plain + hostile)
    env = {"OCISTAGE_CACHE": str(cache), "OCISTAGE_CONFIG": str(tmp_path / "none.toml")}
    assert _complete("ocistage stage ", env) == sorted(plain)
    assert _complete("ocistage stage oci:/x", env) in ([], [""])


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _complete_here(words: str, cache: Path, shell: str) -> str:
    """The completion protocol run in this process (the property test asks it many times)."""
    parts = words.split(" ")
    out = io.StringIO()
    with _environ({"COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1),
                   "_TYPER_COMPLETE_ARGS": words, "_OCISTAGE_COMPLETE": f"complete_{shell}",
                   "OCISTAGE_CACHE": str(cache)}), contextlib.redirect_stdout(out):
        code = run(parts[1:])
    assert code == 0
    return out.getvalue()


def _control(char: str) -> bool:
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(st.text(min_size=1, max_size=30), max_size=8),
       prefix=st.sampled_from(["", "o", "oci:", "r"]))
def test_completion_is_one_plain_candidate_per_line_whatever_the_cache_holds(
        tmp_path_factory: pytest.TempPathFactory, names: list[str], prefix: str) -> None:
    cache = tmp_path_factory.mktemp("cache")
    _write_index(cache, names)
    # what bash's script makes of it: $(...) drops the trailing newlines, IFS=$'\n' splits
    bash = _complete_here(f"ocistage stage {prefix}", cache, "bash").rstrip("\n")
    candidates = bash.split("\n") if bash else []
    assert candidates == bash.splitlines()  # no other line break in a candidate
    assert not any(_control(char) for char in bash.replace("\n", ""))
    assert all(word and not any(char.isspace() for char in word) for word in candidates)
    assert set(candidates) <= {name for name in names if name.startswith(prefix)}
    zsh = _complete_here(f"ocistage stage {prefix}", cache, "zsh")
    assert not any(_control(char) for char in zsh.replace("\n", ""))
