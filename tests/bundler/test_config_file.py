"""The config file: every key checked (file, key and expected type in the error), unknown keys
warned with a suggestion, every key documented, and the origin of every effective setting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ocistage.bundler import settings as settings_module
from ocistage.bundler.settings import KEYS, REGISTRY_KEYS, load_settings
from ocistage.cache.notice import Kind
from ocistage.errors import UsageError
from pytest_ocistage.components import running_as_root

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config.md"


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(site file, user file), both absent until a test writes them; no env overrides."""
    site, user = tmp_path / "site.toml", tmp_path / "user.toml"
    monkeypatch.setattr(settings_module, "SITE_CONFIG", site)
    monkeypatch.setenv("OCISTAGE_CONFIG", str(user))
    for name in ("OCISTAGE_CACHE", "OCISTAGE_PULL", "OCISTAGE_MAX_SIZE", "OCISTAGE_STAGE_TO",
                 "OCISTAGE_INSECURE_REGISTRIES", "OCISTAGE_UNPACK_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    return site, user


@pytest.mark.parametrize(("line", "key", "expected"), [
    ('jobs = "x"', "jobs", "an integer from 1 to 64"),
    ("jobs = 0", "jobs", "an integer from 1 to 64"),
    ("jobs = true", "jobs", "an integer from 1 to 64"),
    ("cache = 5", "cache", "a non-empty string"),
    ('pull = "sometimes"', "pull", '"always", "missing", "never"'),
    ("loopback_insecure = 1", "loopback_insecure", "true or false"),
    ('keep_snapshot = "yes"', "keep_snapshot", "true or false"),
    ('max_size = "big"', "max_size", "a size"),
    ('unpack_limit = "huge"', "unpack_limit", "a size"),
    ("max_size = -1", "max_size", "a size"),
    ("stage_to = []", "stage_to", "a non-empty string"),
    ("ca_file = 3.5", "ca_file", "a non-empty string"),
    ("registries = 1", "registries", "a table"),
    ('[registries."r:5000"]\ninsecure = "yes"', 'registries."r:5000".insecure', "true or false"),
    ('[registries."r:5000"]\nmirrors = "https://m"', 'registries."r:5000".mirrors',
     "a list of URLs"),
])
def test_a_bad_value_names_file_key_and_type(files: tuple[Path, Path], line: str, key: str,
                                             expected: str) -> None:
    """``jobs = "x"`` and ``cache = 5`` printed tracebacks (ValueError, TypeError)."""
    _site, user = files
    user.write_text(line + "\n")
    with pytest.raises(UsageError) as info:
        load_settings()
    assert str(user) in info.value.message
    assert f"`{key}` must be " in info.value.message and expected in info.value.message
    assert "docs/config.md" in (info.value.hint or "")
    assert info.value.exit_code == 2


def test_the_site_file_is_checked_too(files: tuple[Path, Path]) -> None:
    site, _user = files
    site.write_text("jobs = 1.5\n")
    with pytest.raises(UsageError, match=re.escape(f"config file {site}: `jobs`")):
        load_settings()


def test_unknown_keys_are_warned_with_the_closest_key(files: tuple[Path, Path]) -> None:
    _site, user = files
    user.write_text('jobz = 3\nmax-size = "1G"\nwhatever = 1\n'
                    '[registries."r:5000"]\nmirorrs = ["https://m"]\n')
    loaded = load_settings()
    assert loaded.jobs == 6  # the misspelt key is not used
    assert {w.kind for w in loaded.warnings} == {Kind.CONFIG}
    assert [str(w) for w in loaded.warnings] == [
        f"config file {user}: unknown key `jobz` (did you mean `jobs`?); it is ignored",
        f"config file {user}: unknown key `max-size` (did you mean `max_size`?); it is ignored",
        f"config file {user}: unknown key `whatever`; it is ignored",
        f'config file {user}: unknown key `registries."r:5000".mirorrs` '
        f'(did you mean `registries."r:5000".mirrors`?); it is ignored',
    ]


def test_a_toml_error_points_to_the_documentation(files: tuple[Path, Path]) -> None:
    _site, user = files
    user.write_text("jobs = \n")
    with pytest.raises(UsageError) as info:
        load_settings()
    assert f"cannot read config file {user}" in info.value.message
    assert "docs/config.md" in (info.value.hint or "") and "--help" not in (info.value.hint or "")
    user.write_bytes(b'cache = "\xff"\n')
    with pytest.raises(UsageError, match="cannot read config file"):
        load_settings()


def test_every_key_is_documented() -> None:
    text = DOCS.read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", text, re.MULTILINE))
    assert documented == set(KEYS) | set(REGISTRY_KEYS)
    for variable in ("OCISTAGE_CONFIG", "OCISTAGE_CACHE", "OCISTAGE_PULL", "OCISTAGE_MAX_SIZE",
                     "OCISTAGE_UNPACK_LIMIT",
                     "OCISTAGE_STAGE_TO", "OCISTAGE_INSECURE_REGISTRIES", "/etc/ocistage"):
        assert variable in text


def test_origins_say_option_environment_file_or_default(files: tuple[Path, Path],
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    site, user = files
    site.write_text('jobs = 3\npull = "missing"\n[registries."a:1"]\ninsecure = true\n')
    user.write_text('jobs = 4\nmax_size = 1000\n[registries."b:1"]\nmirrors = ["http://m"]\n')
    monkeypatch.setenv("OCISTAGE_PULL", "never")
    loaded = load_settings(cache=tmp_path / "c", insecure=["c:1"])
    assert (loaded.jobs, loaded.pull, loaded.max_size) == (4, "never", 1000)
    assert loaded.origins == {
        "cache": "option --cache",
        "jobs": f"file {user}",
        "pull": "environment OCISTAGE_PULL",
        "max_size": f"file {user}",
        "unpack_limit": "default",
        "stage_to": "default",
        "ca_file": "default",
        "loopback_insecure": "default",
        "keep_snapshot": "default",
        "pyxis_store": "default",
        "pyxis_squashfs_only": "default",
        "pyxis_compression": "default",
        "policy": "default",
        "registries_d": "default",
        "policy_mandatory": "default",
        "insecure_registries": f"file {site}, option --insecure-registry",
        "mirrors": f"file {user}",
    }
    assert loaded.insecure_registries == {"a:1", "c:1"}
    assert loaded.mirrors == {"b:1": ("http://m",)}


def test_the_user_file_can_turn_off_a_site_insecure_registry(files: tuple[Path, Path]) -> None:
    site, user = files
    site.write_text('[registries."a:1"]\ninsecure = true\n')
    user.write_text('[registries."a:1"]\ninsecure = false\n')
    assert load_settings().insecure_registries == frozenset()


_TOML_VALUES = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.booleans(),
    st.text(max_size=12), st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.text(max_size=5), max_size=3))


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + "".join(c if c.isalnum() or c in " ./-_:" else f"\\u{ord(c):04x}"
                             for c in value) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    return repr(value)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from([*KEYS, "jobz", "insecure"]), value=_TOML_VALUES)
@example(key="cache", value="~0")  # no user "0": kept as written (Path.expanduser raised)
def test_any_value_of_any_key_is_a_setting_or_a_usage_error(files: tuple[Path, Path],
                                                            key: str, value: object) -> None:
    _site, user = files
    user.write_text(f"{key} = {_toml(value)}\n")
    try:
        load_settings()
    except UsageError as error:
        assert str(user) in error.message


def test_a_bad_environment_value_names_the_variable(files: tuple[Path, Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OCISTAGE_MAX_SIZE", "big")
    with pytest.raises(UsageError, match=r"invalid size 'big' \(environment OCISTAGE_MAX_SIZE\)"):
        load_settings()
    monkeypatch.delenv("OCISTAGE_MAX_SIZE")
    monkeypatch.setenv("OCISTAGE_PULL", "often")
    with pytest.raises(UsageError, match=r"'often' \(environment OCISTAGE_PULL\)"):
        load_settings()


def _one_line_error(files: tuple[Path, Path]) -> UsageError:
    with pytest.raises(UsageError) as info:
        load_settings()
    assert info.value.exit_code == 2
    return info.value


def test_a_deeply_nested_or_huge_config_is_a_usage_error(files: tuple[Path, Path]) -> None:
    """20,000 nested arrays gave `internal error: RecursionError`, a 1 GiB file MemoryError
    (issue 27.11)."""
    _site, user = files
    user.write_text("x = " + "[" * 20000 + "]" * 20000 + "\n")
    assert "nested too deeply" in _one_line_error(files).message
    user.write_text("x = 1\n")
    with user.open("r+b") as out:
        out.truncate(1 << 30)  # sparse: the size is what counts
    assert "larger than 1 MiB" in _one_line_error(files).message


def test_a_fifo_config_is_refused_without_waiting(files: tuple[Path, Path]) -> None:
    import os

    _site, user = files
    os.mkfifo(user)
    assert "not a regular file" in _one_line_error(files).message


def test_a_config_others_can_write_is_refused_as_ssh_does(files: tuple[Path, Path]) -> None:

    _site, user = files
    user.write_text("jobs = 3\n")
    user.chmod(0o666)
    error = _one_line_error(files)
    assert "writable by every user" in error.message and "chmod go-w" in (error.hint or "")


@pytest.mark.needs_root("a config file of another user's")
def test_a_config_of_another_user_is_refused(files: tuple[Path, Path]) -> None:
    import os

    _site, user = files
    user.write_text("jobs = 3\n")
    os.chown(user, 65534, 65534)
    assert "owned by" in _one_line_error(files).message
    os.chown(user, os.getuid(), os.getgid())
    assert load_settings().jobs == 3


def test_another_users_home_is_not_where_my_settings_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook run by a daemon started from root's shell has HOME=/root (issue 26): a user's
    settings come from that user, whatever HOME says."""
    import os
    import pwd

    from ocistage.cache.userdirs import home_dir, xdg_dir

    # for a user, root's directories are another user's
    foreign, foreign_config = Path("/"), Path("/etc")
    if running_as_root():
        foreign = tmp_path / "foreign-home"
        foreign_config = foreign / ".config"
        foreign_config.mkdir(parents=True)
        os.chown(foreign, 65534, 65534)
        os.chown(foreign_config, 65534, 65534)
    monkeypatch.setenv("HOME", str(foreign))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(foreign_config))
    mine = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert home_dir() == mine
    assert xdg_dir("XDG_CONFIG_HOME", ".config") == mine / ".config"
    own = tmp_path / "own"
    own.mkdir()
    monkeypatch.setenv("HOME", str(own))
    assert home_dir() == own
