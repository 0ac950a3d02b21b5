"""The doctor's check of a registry: which one ``doctor REF`` or ``--registry`` asks about,
and whether it answers its ``/v2/`` API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ocistage.bundler.doctor.report import Check, missing, ok, warn
from ocistage.errors import OcistageError

if TYPE_CHECKING:
    from ocistage.bundler.settings import Settings


def check_registry(host: str, ping: Callable[[], None]) -> Check:
    """``ping`` (the registry client's ``/v2/``) of ``host``: it answers, asks for
    credentials, or cannot be reached (with the client's hint)."""
    from ocistage.bundler.registry.errors import AuthenticationError

    try:
        ping()
    except AuthenticationError as exc:
        return warn("registry", f"{host} answers, but not to us: {exc.message}",
                    exc.hint or "log in", core=True)
    except OcistageError as exc:
        return missing("registry", exc.message, exc.hint, core=True)
    return ok("registry", f"{host} answers its /v2/ API", core=True)


def registry_checks(settings: Settings | None, host: str | None) -> list[Check]:
    """A ping of ``host``, once, without retries (the doctor says how it stands now)."""
    if host is None:
        return []
    if settings is None:
        return [missing("registry", f"{host} not asked: the settings did not load",
                        "fix the config first", core=True)]
    from ocistage.bundler.registry.client import RegistryClient

    config = replace(settings.registry_config(), max_retries=0, deadline=30.0, timeout=15.0)

    def ping() -> None:
        with RegistryClient(host, config) as client:
            client.ping()
    return [check_registry(host, ping)]


def registry_to_check(ref: str | None, registry: str | None) -> str | None:
    """The registry ``doctor REF`` or ``doctor --registry HOST`` asks about, if any."""
    from ocistage.errors import UsageError

    if ref is not None and registry is not None:
        raise UsageError("give REF or --registry, not both",
                         "ocistage doctor REF checks REF's registry")
    if ref is None:
        return registry
    from ocistage.bundler.image.reference import RegistryReference, parse_reference

    source = parse_reference(ref)
    if not isinstance(source, RegistryReference):
        raise UsageError(f"{ref} is a local source, not in a registry",
                         "give a registry reference (registry/repo:tag) or --registry HOST")
    return source.registry
