"""Which policy applies: options and config over containers/image's lookup, and a site's
mandatory policy over everything a user chooses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ocistage.bundler import settings
from ocistage.bundler.settings import load_settings
from ocistage.bundler.trust import files
from ocistage.bundler.trust.errors import PolicyError
from ocistage.bundler.trust.files import effective, policy_applies

REJECT = json.dumps({"default": [{"type": "reject"}]})
ACCEPT = json.dumps({"default": [{"type": "insecureAcceptAnything"}]})


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private site file, user file, HOME and /etc/containers."""
    monkeypatch.setattr(settings, "SITE_CONFIG", tmp_path / "site.toml")
    monkeypatch.setenv("OCISTAGE_CONFIG", str(tmp_path / "user.toml"))
    home = tmp_path / "home"
    (home / ".config" / "containers").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    etc = tmp_path / "etc"
    etc.mkdir()
    monkeypatch.setattr(files, "SYSTEM_POLICY", etc / "policy.json")
    monkeypatch.setattr(files, "SYSTEM_REGISTRIES_D", etc / "registries.d")
    return tmp_path


def chosen(**options: str) -> tuple[Path | None, list[str]]:
    loaded = load_settings(**options)  # type: ignore[arg-type]
    trust = effective(loaded.trust_config())
    return trust.policy.path, [str(n) for n in trust.notices]


def test_no_policy_anywhere_accepts_everything(world: Path) -> None:
    assert chosen() == (None, [])
    assert not policy_applies(load_settings().trust_config())


def test_the_lookup_order(world: Path) -> None:
    etc, user = world / "etc" / "policy.json", world / "home/.config/containers/policy.json"
    etc.write_text(ACCEPT)
    assert chosen()[0] == etc
    assert not policy_applies(load_settings().trust_config())  # Debian's default
    user.write_text(REJECT)
    assert chosen()[0] == user
    assert policy_applies(load_settings().trust_config())
    site_named = world / "site-policy.json"
    site_named.write_text(REJECT)
    (world / "site.toml").write_text(f'policy = "{site_named}"\n')
    assert chosen()[0] == site_named
    option = world / "option.json"
    option.write_text(ACCEPT)
    assert chosen(policy_file=str(option))[0] == option


def test_a_mandatory_site_policy_ignores_the_user_with_a_notice(world: Path) -> None:
    site_policy = world / "site-policy.json"
    site_policy.write_text(REJECT)
    (world / "home/.config/containers/policy.json").write_text(ACCEPT)
    (world / "user.toml").write_text(f'policy = "{world / "mine.json"}"\n'
                                     "policy_mandatory = false\n")
    (world / "site.toml").write_text(f'policy = "{site_policy}"\npolicy_mandatory = true\n')
    path, notices = chosen(policy_file=str(world / "option.json"))
    assert path == site_policy
    assert len(notices) == 2 and all("is ignored" in n for n in notices)
    assert "option --policy" in notices[0]
    # without a site policy file named: the system's, never a user's
    (world / "site.toml").write_text("policy_mandatory = true\n")
    with pytest.raises(PolicyError, match="No such file"):
        chosen()
    (world / "etc" / "policy.json").write_text(REJECT)
    assert chosen()[0] == world / "etc" / "policy.json"


def test_mandatory_is_read_from_the_site_file_only(world: Path) -> None:
    (world / "user.toml").write_text("policy_mandatory = true\n")
    assert load_settings().policy_mandatory is False


def test_a_named_policy_that_is_missing_is_an_error(world: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the policy"):
        chosen(policy_file=str(world / "none.json"))
