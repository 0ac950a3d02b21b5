"""registries.d: the YAML subset, merging, and which lookaside store an image uses."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ocistage.bundler.trust import miniyaml
from ocistage.bundler.trust.errors import PolicyError
from ocistage.bundler.trust.identity import parse_docker_name
from ocistage.bundler.trust.lookaside import signature_url
from ocistage.bundler.trust.registriesd import lookaside_base, read_registries_d
from ocistage.cache.digest import Digest

DEBIAN_DEFAULT = """\
# This is a default registries.d configuration file.  You may
# add to this file or create additional files in registries.d/.
#
# lookaside: indicates a location that is read and write
docker:
#  atomic.example.com:
#    lookaside: https://atomic.example.com/sigstore

# The default location for signatures
default-docker:
#  lookaside: file:///var/lib/containers/sigstore
  lookaside-staging: file:///var/lib/containers/sigstore
"""


def test_the_debian_default_file_reads() -> None:
    assert miniyaml.parse(DEBIAN_DEFAULT) == {
        "docker": None,
        "default-docker": {"lookaside-staging": "file:///var/lib/containers/sigstore"}}


@pytest.mark.parametrize("text", ["a:\n  - b\n", "a: [1]\n", "a: &x b\n", "a:\n\tb: c\n",
                                  "a: b\na: c\n", "a:\n  b: c\n d: e\n", "just text\n"])
def test_other_yaml_is_refused_with_the_line(text: str) -> None:
    with pytest.raises(miniyaml.YamlError, match="line"):
        miniyaml.parse(text)


@given(st.text(max_size=120))
def test_any_text_reads_or_fails_cleanly(text: str) -> None:
    with contextlib.suppress(miniyaml.YamlError):
        miniyaml.parse(text)


def test_the_most_specific_namespace_then_default_docker(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "docker:\n  reg.io:5000/ns:\n    lookaside: file:///ns\n"
        "  reg.io:5000:\n    sigstore: https://host/sigs\n"
        "  reg.io:5000/ns/x:t:\n    lookaside: file:///tag\n")
    (tmp_path / "b.yaml").write_text("default-docker:\n  lookaside: file:///default\n")
    (tmp_path / "ignored.yml").write_text("not: [yaml we read]\n")
    config = read_registries_d(tmp_path)
    home = Path("/home/u")

    def base(text: str) -> str:
        parsed = parse_docker_name(text)
        assert parsed is not None
        return lookaside_base(config, parsed, home)

    assert base("reg.io:5000/ns/x:t") == "file:///tag"
    assert base("reg.io:5000/ns/x:u") == "file:///ns"
    assert base("reg.io:5000/other:1") == "https://host/sigs"
    assert base("else.io/a:1") == "file:///default"


def test_a_namespace_defined_twice_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("docker:\n  r.io:\n    lookaside: file:///a\n")
    (tmp_path / "b.yaml").write_text("docker:\n  r.io:\n    lookaside: file:///b\n")
    with pytest.raises(PolicyError, match="defined both in"):
        read_registries_d(tmp_path)


def test_a_missing_directory_configures_nothing(tmp_path: Path) -> None:
    config = read_registries_d(tmp_path / "none")
    parsed = parse_docker_name("r.io/a:1")
    assert parsed is not None
    assert lookaside_base(config, parsed, Path("/h")).startswith("file:///")


def test_the_signature_url_layout() -> None:
    digest = Digest.parse("sha256:" + "b" * 64)
    assert signature_url("file:///s", "ns/repo", digest, 2) == \
        f"file:///s/ns/repo@sha256={'b' * 64}/signature-2"
