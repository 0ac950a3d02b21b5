"""The registries' settings: insecure registries and mirrors from the config files' tables, the
environment and the options, added up, with where each was set (for ``config show``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ocistage.bundler.image.reference import check_registry
from ocistage.errors import UsageError

#: (host, origin, entry) of every ``[registries."HOST"]`` table, site file first
Tables = Sequence[tuple[str, str, dict[str, Any]]]

#: the origin of a setting nobody set (``ocistage.bundler.settings.DEFAULT``)
DEFAULT = "default"


def registries(tables: Tables, insecure: Sequence[str], mirrors: Sequence[str],
               origins: dict[str, str]) -> tuple[frozenset[str], dict[str, tuple[str, ...]]]:
    """Insecure registries and mirrors: the files' tables (site, then user), the environment
    and the options add up; their origins go into ``origins``."""
    insecure_hosts, insecure_from = _insecure_registries(tables, insecure)
    mirror_map, mirrors_from = _mirrors(tables, mirrors)
    origins["insecure_registries"] = ", ".join(dict.fromkeys(insecure_from)) or DEFAULT
    origins["mirrors"] = ", ".join(dict.fromkeys(mirrors_from)) or DEFAULT
    return frozenset(insecure_hosts), {host: tuple(urls) for host, urls in mirror_map.items()}


def parse_mirror(text: str) -> tuple[str, str]:
    """``REGISTRY=URL`` as given to ``--mirror``."""
    registry, sep, url = text.partition("=")
    if not sep or not registry or not url.startswith(("http://", "https://")):
        raise UsageError(f"invalid mirror {text!r}",
                         "use --mirror REGISTRY=URL, e.g. --mirror docker.io=https://m.example")
    return registry.strip(), url.strip().rstrip("/")


def _insecure_registries(tables: Tables, insecure: Sequence[str]) -> tuple[set[str], list[str]]:
    """The insecure registries of the files, the environment and ``--insecure-registry``,
    and where they were set."""
    hosts: set[str] = set()
    origins: list[str] = []
    for host, origin, entry in tables:
        if "insecure" in entry:  # the user's file may say false where the site's says true
            hosts.discard(host)
            if entry["insecure"]:
                hosts.add(host)
                origins.append(origin)
    env_insecure = os.environ.get("OCISTAGE_INSECURE_REGISTRIES", "")
    if env_insecure.strip(","):
        hosts |= _checked_registries(env_insecure.split(","), "OCISTAGE_INSECURE_REGISTRIES")
        origins.append("environment OCISTAGE_INSECURE_REGISTRIES")
    if any(h.strip() for h in insecure):
        hosts |= _checked_registries(insecure, "--insecure-registry")
        origins.append("option --insecure-registry")
    return hosts, origins


def _checked_registries(texts: Sequence[str], origin: str) -> set[str]:
    """The registries named in ``texts`` (blanks skipped), each checked as a reference's
    registry is (a port from 1 to 65535): a typo must not leave TLS on for the host meant."""
    hosts = {text.strip() for text in texts if text.strip()}
    for host in sorted(hosts):
        check_registry(host, origin)
    return hosts


def _mirrors(tables: Tables, mirrors: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """The mirrors of each registry, from the files and ``--mirror`` (tried first), and
    where they were set."""
    mirror_map: dict[str, list[str]] = {}
    origins: list[str] = []
    for host, origin, entry in tables:
        if entry.get("mirrors"):
            mirror_map[host] = [url.rstrip("/") for url in entry["mirrors"]]
            origins.append(origin)
    for text in mirrors:
        host, url = parse_mirror(text)
        mirror_map.setdefault(host, [])
        if url not in mirror_map[host]:
            mirror_map[host].insert(0, url)
    if mirrors:
        origins.append("option --mirror")
    return mirror_map, origins
