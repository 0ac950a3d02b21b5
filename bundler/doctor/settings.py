"""The doctor's checks of the settings: the config files, the CA file, the image policy, and
in :func:`settings_checks` the places they name (the cache, the stage target)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ocistage.bundler.doctor.places import cache_check, check_stage_target, judge_stage_dir
from ocistage.bundler.doctor.report import Check, missing, ok, warn
from ocistage.errors import OcistageError

if TYPE_CHECKING:
    from ocistage.bundler.settings import Settings


def check_config(settings: Settings | None, error: OcistageError | None) -> Check:
    if error is not None:
        return missing("config", error.message, error.hint, core=True)
    assert settings is not None
    files = sorted({origin.removeprefix("file ") for origin in settings.origins.values()
                    if origin.startswith("file ")})
    where = f"from {', '.join(files)}" if files else "no config file"
    if settings.warnings:
        return warn("config", f"{where}: {settings.warnings[0]}"
                    + (f" (and {len(settings.warnings) - 1} more)"
                       if len(settings.warnings) > 1 else ""),
                    "fix or remove the key (docs/config.md)", core=True)
    return ok("config", where, core=True)


def check_ca_file(path: str | None, origin: str) -> Check | None:
    """The extra CA bundle, checked as a registry client checks it (None: none given)."""
    if path is None:
        return None
    from ocistage.bundler.registry.cafile import check_ca_file as parse
    from ocistage.bundler.registry.errors import CaFileError

    try:
        count = parse(path, origin)
    except CaFileError as exc:
        return missing("ca_file", exc.message, exc.hint, core=True)
    return ok("ca_file", f"{path} ({origin}): {count} CA certificate{'s' * (count != 1)}",
              core=True)


def check_image_policy(settings: Settings) -> Check:
    """Which image policy every pull obeys (docs/trust.md, "Image trust"), and gpgv when it
    asks for signatures."""
    import shutil

    from ocistage.bundler.trust.files import effective

    try:
        trust = effective(settings.trust_config())
    except OcistageError as exc:
        return missing("image_policy", exc.message, exc.hint, core=True)
    if not trust.found:
        return ok("image_policy", "none: every image is accepted (no policy.json)")
    mandatory = " (mandatory for this site)" if settings.policy_mandatory else ""
    signed = any(requirement.type == "signedBy"
                 for requirements in [trust.policy.default,
                                      *(r for scopes in trust.policy.transports.values()
                                        for r in scopes.values())]
                 for requirement in requirements)
    if signed and shutil.which("gpgv") is None:
        return missing("image_policy", f"{trust.policy.path}{mandatory} asks for signatures, "
                       "but gpgv is not installed: every signed scope rejects",
                       "apt-get install gpgv", core=True)
    return ok("image_policy", f"{trust.policy.path}{mandatory}")


def settings_checks(load: Callable[[], Settings],
                    stage_to: str | None) -> tuple[Settings | None, list[Check]]:
    """The config files, the CA file, the cache and the stage target (``stage_to``: the one
    given to ``doctor --to``, else the configured one)."""
    try:
        settings: Settings | None = load()
    except OcistageError as exc:
        return None, [check_config(None, exc)]
    assert settings is not None
    checks = [check_config(settings, None)]
    ca = check_ca_file(settings.ca_file, settings.origins.get("ca_file", "ca_file"))
    checks += [ca] if ca is not None else []
    checks.append(cache_check(settings.cache))
    target = stage_to or settings.stage_to
    origin = "option --to" if stage_to else settings.origins.get("stage_to", "")
    checks.append(check_stage_target(target, origin, judge_stage_dir))
    checks.append(check_image_policy(settings))
    return settings, checks
