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


# -- bash itself: words split at COMP_WORDBREAKS (':' and '=' by default) ------------------------

#: completes LINE in bash as readline would: COMP_WORDS split at white space and at the word
#: break characters (each run of them a word of its own), the function named by `complete -p`
BASH_DRIVER = r"""
set -u
eval "$(cat "$SCRIPT")"
spec=$(complete -p ocistage)
func=${spec##*-F }; func=${func%% *}
COMP_LINE=$LINE; COMP_POINT=${#LINE}
COMP_WORDS=(); word=''; breaks=$COMP_WORDBREAKS
for ((i = 0; i < ${#LINE}; i++)); do
    c=${LINE:i:1}
    if [[ $c == ' ' ]]; then
        [[ -n $word ]] && COMP_WORDS+=("$word"); word=''
    elif [[ $breaks == *"$c"* ]]; then
        if [[ -n $word && $breaks != *"${word: -1}"* ]]; then COMP_WORDS+=("$word"); word=''; fi
        word+=$c
    else
        if [[ -n $word && $breaks == *"${word: -1}"* ]]; then COMP_WORDS+=("$word"); word=''; fi
        word+=$c
    fi
done
COMP_WORDS+=("$word")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
"$func" ocistage ocistage "${COMP_WORDS[COMP_CWORD-1]:-}"
printf '%s\n' "${COMPREPLY[@]}"
"""


def _bash_complete(line: str, env: dict[str, str], tmp_path: Path) -> list[str]:
    script = tmp_path / "ocistage.bash"
    shown_script = subprocess.run([sys.executable, "-m", "ocistage", "--show-completion", "bash"],
                                  capture_output=True, text=True, timeout=60, check=True,
                                  env={**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION":
                                       "1"})
    script.write_text(shown_script.stdout)
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    launcher = bindir / "ocistage"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} -m ocistage \"$@\"\n")
    launcher.chmod(0o755)
    result = subprocess.run(["bash", "--norc", "--noprofile", "-c", BASH_DRIVER],
                            capture_output=True, text=True, timeout=60, check=False,
                            env={**os.environ, **env, "SCRIPT": str(script), "LINE": line,
                                 "PATH": f"{bindir}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line]


def test_bash_completes_references_across_the_colon(tmp_path: Path) -> None:
    """Issue 38: in an interactive bash every reference (it has a ':') completed to nothing,
    because bash hands the completion the words split at ':'."""
    cache = tmp_path / "cache"
    names = ["registry.site.example:5000/team/app:1.0", "registry.site.example:5000/team/app:2.0",
             "docker.io/library/alpine:3.19"]
    _write_index(cache, names)
    env = {"OCISTAGE_CACHE": str(cache), "OCISTAGE_CONFIG": str(tmp_path / "none.toml")}
    # bash keeps what stands before the last ':' and inserts the rest
    assert _bash_complete("ocistage bundle docker.io/library/alpine:", env, tmp_path) == ["3.19"]
    assert _bash_complete("ocistage bundle registry.site.example:5000/team/app:",
                          env, tmp_path) == ["1.0", "2.0"]
    assert _bash_complete("ocistage stage registry.site.example:50", env,
                          tmp_path) == ["5000/team/app:1.0", "5000/team/app:2.0"]
    assert _bash_complete("ocistage pull docker.io/li", env, tmp_path) == [
        "docker.io/library/alpine:3.19"]
    # option values after '=' (another word break) still complete
    assert _bash_complete("ocistage pull --pull=mi", env, tmp_path) == ["missing"]
