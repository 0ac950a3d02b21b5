"""Which policy and registries.d apply: ocistage's settings over containers/image's lookup.

Without a mandatory site policy: ``--policy`` (or the ``policy`` key of the config files),
else ``~/.config/containers/policy.json``, else
``/etc/containers/policy.json``, else none (every image is accepted, as before image trust
existed); registries.d likewise (``--registries.d``, ``registries_d``,
``~/.config/containers/registries.d``, ``/etc/containers/registries.d``). ``~`` is the
caller's own home (:func:`ocistage.cache.userdirs.home_dir`: a ``$HOME`` inherited from
slurmd that is not the caller's does not count).

With ``policy_mandatory = true`` in the site config file, the site's ``policy`` (else
``/etc/containers/policy.json``) and ``registries_d`` (else ``/etc/containers/registries.d``)
apply to everyone; a user's own files and options are ignored with a notice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ocistage.bundler.trust.policy import ACCEPT_ANYTHING, Policy, read_policy
from ocistage.cache.notice import Kind, Notice
from ocistage.cache.userdirs import home_dir

if TYPE_CHECKING:
    from ocistage.bundler.trust.registriesd import RegistriesD

SYSTEM_POLICY = Path("/etc/containers/policy.json")
SYSTEM_REGISTRIES_D = Path("/etc/containers/registries.d")


@dataclass(frozen=True)
class TrustConfig:
    """The trust settings of one command (see the module docstring).

    ``policy``/``registries_d``: what the user chose (option, environment, config files);
    ``site_policy``/``site_registries_d``: what the site config file says; ``mandatory``: the
    site's policy applies to everyone. ``enabled`` False turns the check off (library callers
    that decide elsewhere; never the command line)."""

    policy: Path | None = None
    registries_d: Path | None = None
    mandatory: bool = False
    site_policy: Path | None = None
    site_registries_d: Path | None = None
    policy_origin: str = ""
    enabled: bool = True


@dataclass(frozen=True)
class EffectiveTrust:
    """The policy that applies, the registries.d directory, the caller's home, and notices
    (a user's files ignored under a mandatory site policy)."""

    policy: Policy
    registries_d: Path
    home: Path
    found: bool  # a policy file applies (False: none anywhere, today's behaviour)
    notices: tuple[Notice, ...] = field(default=())


def _user_file(home: Path, name: str) -> Path:
    return home / ".config" / "containers" / name


def policy_path(config: TrustConfig, home: Path) -> tuple[Path | None, list[Notice]]:
    """The policy file that applies (None: none) and notices."""
    notices: list[Notice] = []
    if config.mandatory:
        ignored = [what for what, present in (
            (f"the policy {config.policy} ({config.policy_origin})",
             config.policy is not None and config.policy != config.site_policy),
            (f"your policy {_user_file(home, 'policy.json')}",
             _user_file(home, "policy.json").is_file()),
            (f"the registries.d {config.registries_d}",
             config.registries_d is not None
             and config.registries_d != config.site_registries_d)) if present]
        for what in ignored:
            notices.append(Notice(Kind.CONFIG, f"{what} is ignored: the site makes its "
                                               "image policy mandatory (policy_mandatory)"))
        return config.site_policy or SYSTEM_POLICY, notices
    if config.policy is not None:
        return config.policy, notices
    for candidate in (_user_file(home, "policy.json"), SYSTEM_POLICY):
        if candidate.exists():
            return candidate, notices
    return None, notices


def registries_d_path(config: TrustConfig, home: Path) -> Path:
    if config.mandatory:
        return config.site_registries_d or SYSTEM_REGISTRIES_D
    if config.registries_d is not None:
        return config.registries_d
    user = _user_file(home, "registries.d")
    return user if user.is_dir() else SYSTEM_REGISTRIES_D


def effective(config: TrustConfig) -> EffectiveTrust:
    """Read the policy that applies (a PolicyError if it is invalid or unreadable: a
    mandatory or named policy that is missing is an error too, not "no policy")."""
    home = home_dir()
    path, notices = policy_path(config, home)
    registries = registries_d_path(config, home)
    if path is None:
        return EffectiveTrust(ACCEPT_ANYTHING, registries, home, False, tuple(notices))
    return EffectiveTrust(read_policy(path), registries, home, True, tuple(notices))


def registries(trust: EffectiveTrust) -> RegistriesD:
    # read only where a signature is looked up: a policy that asks for none never needs it
    from ocistage.bundler.trust.registriesd import read_registries_d

    return read_registries_d(trust.registries_d)


def policy_applies(config: TrustConfig) -> bool:
    """Whether the policy that applies can reject anything (False: no policy file, or one
    that accepts every image, as Debian's default). A PolicyError if it is invalid."""
    if not config.enabled:
        return False
    trust = effective(config)
    if not trust.found:
        return False
    lists = [trust.policy.default,
             *(requirements for scopes in trust.policy.transports.values()
               for requirements in scopes.values())]
    return any(requirement.type != "insecureAcceptAnything"
               for requirements in lists for requirement in requirements)
