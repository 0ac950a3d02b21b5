"""Configuration: command-line options layered over environment variables and a config file.

The config file is TOML, at ``$OCISTAGE_CONFIG`` or ``$XDG_CONFIG_HOME/ocistage/config.toml``
(``~/.config/ocistage/config.toml``); a site may also put one at ``/etc/ocistage/config.toml``,
which the user's file overrides key by key::

    cache = "/scratch/ocistage-cache"       # like --cache / $OCISTAGE_CACHE
    jobs = 6                                # parallel blob downloads
    ca_file = "/etc/ssl/site-ca.pem"        # extra CA bundle for HTTPS registries
    loopback_insecure = true                # 127.0.0.0/8, ::1, localhost: skip TLS checks,
                                            # fall back to HTTP (as Docker does)
    max_size = "50G"                        # cache budget: pulls GC down to it (LRU); also
                                            # $OCISTAGE_MAX_SIZE; sizes like 500M, 20G, 1.5T
    unpack_limit = "200G"                   # file data one bundle may unpack (bombs stop
                                            # there); also $OCISTAGE_UNPACK_LIMIT; default:
                                            # 100x the compressed layers, at least 4G
    stage_to = "/scratch/bundles"           # default target of `ocistage stage` (--to);
                                            # also $OCISTAGE_STAGE_TO; a directory or a URL
    pull = "missing"                        # like --pull / $OCISTAGE_PULL: always (ask the
                                            # registry), missing (a complete cached copy is
                                            # used as is), never (the cache only)

    [registries."docker.io"]
    mirrors = ["https://mirror.site.example:5000"]   # tried before the origin

    [registries."registry.site.example:5000"]
    insecure = true                         # plain HTTP / unverified TLS

Precedence: command-line option > environment variable > user file > site file > default.
This module is the only place that reads the environment for settings.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cache.errors import UsageError
from cache.sizes import parse_size
from cache.store import Store

if TYPE_CHECKING:
    from bundler.registry_types import RegistryConfig

DEFAULT_JOBS = 6  # parallel blob downloads (bundler.pull's default too)
PULL_POLICIES = ("always", "missing", "never")

SITE_CONFIG = Path("/etc/ocistage/config.toml")


@dataclass(frozen=True)
class Settings:
    cache: Path
    jobs: int = DEFAULT_JOBS
    ca_file: str | None = None
    insecure_registries: frozenset[str] = frozenset()
    mirrors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    loopback_insecure: bool = True
    max_size: int | None = None  # cache budget in bytes; None: unlimited
    stage_to: str | None = None  # default stage target (`stage --to`); None: none configured
    pull: str = "always"  # one of PULL_POLICIES
    unpack_limit: int | None = None  # bytes a bundle may unpack; None: bundler.layers' default

    def registry_config(self) -> RegistryConfig:
        # requests: only commands that talk to a registry import it
        from bundler.registry_types import RegistryConfig

        return RegistryConfig(insecure_registries=self.insecure_registries,
                              ca_file=self.ca_file, mirrors=dict(self.mirrors),
                              loopback_insecure=self.loopback_insecure)


def user_config_path() -> Path:
    env = os.environ.get("OCISTAGE_CONFIG")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(xdg) / "ocistage" / "config.toml"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read config file {path}: {exc}",
                         "fix or remove the file; see `ocistage --help` for its format") from exc


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_mirror(text: str) -> tuple[str, str]:
    """``REGISTRY=URL`` as given to ``--mirror``."""
    registry, sep, url = text.partition("=")
    if not sep or not registry or not url.startswith(("http://", "https://")):
        raise UsageError(f"invalid mirror {text!r}",
                         "use --mirror REGISTRY=URL, e.g. --mirror docker.io=https://m.example")
    return registry.strip(), url.strip().rstrip("/")


def load_settings(
    *,
    cache: Path | None = None,
    jobs: int | None = None,
    ca_file: str | None = None,
    insecure: Sequence[str] = (),
    mirrors: Sequence[str] = (),
    max_size: str | None = None,
    pull: str | None = None,
) -> Settings:
    """Settings from options (arguments), environment and config files, in that precedence."""
    file = _merge(_read_toml(SITE_CONFIG), _read_toml(user_config_path()))
    registries = file.get("registries", {})
    if not isinstance(registries, dict):
        raise UsageError("`registries` in the config file must be a table")

    insecure_hosts = {h for h, r in registries.items() if isinstance(r, dict) and r.get("insecure")}
    env_insecure = os.environ.get("OCISTAGE_INSECURE_REGISTRIES", "")
    insecure_hosts |= {h.strip() for h in env_insecure.split(",") if h.strip()}
    insecure_hosts |= {h.strip() for h in insecure if h.strip()}

    mirror_map: dict[str, list[str]] = {}
    for host, entry in registries.items():
        if isinstance(entry, dict) and entry.get("mirrors"):
            mirror_map[host] = [str(m).rstrip("/") for m in entry["mirrors"]]
    for text in mirrors:
        host, url = parse_mirror(text)
        mirror_map.setdefault(host, [])
        if url not in mirror_map[host]:
            mirror_map[host].insert(0, url)

    cache_dir = cache or (Path(os.environ["OCISTAGE_CACHE"]) if os.environ.get("OCISTAGE_CACHE")
                          else Path(file["cache"]) if file.get("cache") else Store.default_root())
    jobs_value = jobs if jobs is not None else int(file.get("jobs", DEFAULT_JOBS))
    if jobs_value < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs_value}")
    stage_to = os.environ.get("OCISTAGE_STAGE_TO") or file.get("stage_to") or None
    if stage_to is not None and not isinstance(stage_to, str):
        raise UsageError("`stage_to` in the config file must be a string (a directory or URL)")
    policy = pull or os.environ.get("OCISTAGE_PULL") or str(file.get("pull", "always"))
    if policy not in PULL_POLICIES:
        raise UsageError(f"invalid pull policy {policy!r}",
                         f"use one of {', '.join(PULL_POLICIES)} (--pull, $OCISTAGE_PULL or "
                         "`pull` in the config file)")
    size_text = (max_size or os.environ.get("OCISTAGE_MAX_SIZE")
                 or (str(file["max_size"]) if file.get("max_size") not in (None, "") else None))
    unpack_text = (os.environ.get("OCISTAGE_UNPACK_LIMIT")
                   or (str(file["unpack_limit"]) if file.get("unpack_limit") not in (None, "")
                       else None))
    return Settings(
        cache=cache_dir.expanduser(),
        jobs=jobs_value,
        ca_file=ca_file or file.get("ca_file"),
        insecure_registries=frozenset(insecure_hosts),
        mirrors={host: tuple(urls) for host, urls in mirror_map.items()},
        loopback_insecure=bool(file.get("loopback_insecure", True)),
        max_size=parse_size(size_text) if size_text else None,
        stage_to=os.path.expanduser(stage_to) if stage_to and "://" not in stage_to
        else stage_to,
        pull=policy,
        unpack_limit=parse_size(unpack_text) if unpack_text else None,
    )
