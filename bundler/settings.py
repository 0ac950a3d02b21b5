"""Configuration: command-line options layered over environment variables and a config file.

The config file is TOML, at ``$OCISTAGE_CONFIG`` or ``$XDG_CONFIG_HOME/ocistage/config.toml``
(``~/.config/ocistage/config.toml``); a site may also put one at ``/etc/ocistage/config.toml``,
which the user's file overrides key by key::

    cache = "/scratch/ocistage-cache"       # like --cache / $OCISTAGE_CACHE
    jobs = 6                                # parallel blob downloads
    ca_file = "/etc/ssl/site-ca.pem"        # extra CA bundle for HTTPS registries (like
                                            # --ca-file / $OCISTAGE_CA_FILE), checked before
                                            # any connection
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
    keep_snapshot = true                    # like bundle --keep-snapshot: a cold
                                            # `bundle REF DEST` keeps the unpacked image
    pyxis_store = "/shared/ocistage-pyxis"  # squashfs images of ocistage-pyxis-importer
                                            # shared by the site (docs/pyxis.md); default:
                                            # each user's cache
    pyxis_compression = "zstd:3"            # the importer's new images (docs/pyxis.md);
                                            # default: zstd:6, else gzip:6
    policy = "/etc/site/policy.json"        # containers-policy.json(5) (like --policy);
                                            # default: ~/.config/containers/policy.json, else
                                            # /etc/containers/policy.json (docs/trust.md)
    registries_d = "/etc/site/registries.d" # like --registries.d: the signature stores
    policy_mandatory = true                 # site file only: the site's policy applies to
                                            # everyone; users' files and --policy are ignored

    [registries."docker.io"]
    mirrors = ["https://mirror.site.example:5000"]   # tried before the origin

    [registries."registry.site.example:5000"]
    insecure = true                         # plain HTTP / unverified TLS

Precedence: command-line option > environment variable > user file > site file > default.
This module is the only place that reads the environment for settings. Every key is checked:
a value of the wrong type is an error naming the file, the key and what it must be; an
unknown key is a warning with the closest known key. docs/config.md describes every key;
``ocistage config show`` prints the effective settings and where each comes from.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocistage.bundler.registry_settings import DEFAULT as DEFAULT_ORIGIN
from ocistage.bundler.registry_settings import registries
from ocistage.cache.notice import Kind, Notice
from ocistage.cache.sizes import parse_size
from ocistage.cache.userdirs import expand_user, xdg_dir
from ocistage.errors import UsageError
from ocistage.stagers.squashfs_compression import DESCRIBED, Compression

if TYPE_CHECKING:
    from ocistage.bundler.registry.types import RegistryConfig
    from ocistage.bundler.trust.files import TrustConfig
    from ocistage.results import Renderer

DEFAULT_JOBS = 6  # parallel blob downloads (ocistage.bundler.pull's default too)
MAX_JOBS = 64  # as --jobs accepts
PULL_POLICIES = ("always", "missing", "never")

SITE_CONFIG = Path("/etc/ocistage/config.toml")
CONFIG_DOC = "docs/config.md"

DEFAULT = DEFAULT_ORIGIN


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
    # bytes a bundle may unpack; None: ocistage.bundler.unpack.apply' default
    unpack_limit: int | None = None
    keep_snapshot: bool = False  # `bundle REF DEST` unpacks into a snapshot kept in the cache
    # where ocistage-pyxis-importer keeps its squashfs images; None: the cache (docs/pyxis.md)
    pyxis_store: Path | None = None
    pyxis_squashfs_only: bool = False  # the importer drops the layers it squashed (pyxis.md)
    pyxis_compression: str | None = None  # of the importer's new images; None: its default
    # image trust (docs/trust.md): the policy and registries.d the user chose (None: the
    # containers/image lookup), the site's own, and whether the site's is mandatory
    policy: Path | None = None
    registries_d: Path | None = None
    policy_mandatory: bool = False
    site_policy: Path | None = None
    site_registries_d: Path | None = None
    # where each setting above comes from: "option --jobs", "environment OCISTAGE_PULL",
    # "file /etc/ocistage/config.toml" or "default" (several, comma-separated, for the
    # registries, which add up)
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)
    # what the config files hold that ocistage does not know (with the closest known key)
    warnings: tuple[Notice, ...] = field(default=(), compare=False)

    def stage_target(self, option: str | None) -> str:
        """Where `stage` and `submit` stage: the option, else the ``stage_to`` setting
        (``$OCISTAGE_STAGE_TO``, the config file); UsageError when neither is set."""
        target = option or self.stage_to
        if not target:
            raise UsageError("no stage target",
                             "pass --to DIR|URL (submit: --stage-to DIR), set "
                             "$OCISTAGE_STAGE_TO, or put stage_to = \"DIR\" in the config file")
        return target

    def trust_config(self) -> TrustConfig:
        """What :mod:`ocistage.bundler.trust.files` needs to find the policy that applies."""
        from ocistage.bundler.trust.files import TrustConfig

        return TrustConfig(policy=self.policy, registries_d=self.registries_d,
                           mandatory=self.policy_mandatory, site_policy=self.site_policy,
                           site_registries_d=self.site_registries_d,
                           policy_origin=self.origins.get("policy", DEFAULT))

    def registry_config(self) -> RegistryConfig:
        # requests: only commands that talk to a registry import it
        from ocistage.bundler.registry.types import RegistryConfig

        return RegistryConfig(insecure_registries=self.insecure_registries,
                              ca_file=self.ca_file,
                              ca_file_origin=self.origins.get("ca_file", "ca_file"),
                              mirrors=dict(self.mirrors),
                              loopback_insecure=self.loopback_insecure)


def user_config_path() -> Path:
    env = os.environ.get("OCISTAGE_CONFIG")
    if env:
        return Path(expand_user(env))
    return xdg_dir("XDG_CONFIG_HOME", ".config") / "ocistage" / "config.toml"


@dataclass(frozen=True)
class SettingsReport:
    """What ``ocistage config show`` reports: each setting's value and where it comes from,
    and the config files looked for."""

    settings: Settings

    def values(self) -> dict[str, Any]:
        settings = self.settings
        return {
            "cache": str(settings.cache),
            "jobs": settings.jobs,
            "pull": settings.pull,
            "max_size": settings.max_size,
            "unpack_limit": settings.unpack_limit,
            "stage_to": settings.stage_to,
            "ca_file": settings.ca_file,
            "loopback_insecure": settings.loopback_insecure,
            "keep_snapshot": settings.keep_snapshot,
            "pyxis_store": str(settings.pyxis_store) if settings.pyxis_store else None,
            "pyxis_squashfs_only": settings.pyxis_squashfs_only,
            "pyxis_compression": settings.pyxis_compression,
            "policy": str(settings.policy) if settings.policy else None,
            "registries_d": str(settings.registries_d) if settings.registries_d else None,
            "policy_mandatory": settings.policy_mandatory,
            "insecure_registries": sorted(settings.insecure_registries),
            "mirrors": {host: list(urls) for host, urls in sorted(settings.mirrors.items())},
        }

    @staticmethod
    def files() -> list[dict[str, Any]]:
        return [{"path": str(path), "exists": path.is_file()}
                for path in (SITE_CONFIG, user_config_path())]

    def to_json(self) -> dict[str, Any]:
        """What ``config show --json`` prints."""
        return {"settings": {key: {"value": value, "origin": self.settings.origins[key]}
                             for key, value in self.values().items()},
                "files": self.files()}

    def render(self, out: Renderer) -> None:
        values = self.values()
        width = max(map(len, values))
        for key, value in values.items():
            out.line(f"{key:<{width}}  {_text(value)}  ",
                     faint=f"({self.settings.origins[key]})")
        for file in self.files():
            out.line(faint=f"config file: {file['path']}{'' if file['exists'] else ' (absent)'}")


def _text(value: Any) -> str:
    """A setting's value as ``config show`` prints it."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(value) or "-"
    if isinstance(value, dict):
        return "; ".join(f"{host} -> {', '.join(urls)}" for host, urls in value.items()) or "-"
    return str(value)


# -- the config file's keys --------------------------------------------------------------------


def _is_size(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    if not isinstance(value, str):
        return False
    try:
        parse_size(value)
    except UsageError:
        return False
    return True


def _is_url_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(url, str) and url.startswith(("http://", "https://")) for url in value)


# key -> (what it must be, the check); the docs/config.md table says the same
KEYS: Mapping[str, tuple[str, Callable[[object], bool]]] = {
    "cache": ("a non-empty string (a directory)",
              lambda v: isinstance(v, str) and bool(v)),
    "jobs": (f"an integer from 1 to {MAX_JOBS}",
             lambda v: type(v) is int and 1 <= v <= MAX_JOBS),
    "ca_file": ("a non-empty string (a file)", lambda v: isinstance(v, str) and bool(v)),
    "loopback_insecure": ("true or false", lambda v: isinstance(v, bool)),
    "max_size": ('a size: a string such as "50G" or "500M", or a number of bytes', _is_size),
    "unpack_limit": ('a size: a string such as "200G", or a number of bytes', _is_size),
    "stage_to": ("a non-empty string (a directory or a URL)",
                 lambda v: isinstance(v, str) and bool(v)),
    "pull": ("one of " + ", ".join(f'"{p}"' for p in PULL_POLICIES),
             lambda v: v in PULL_POLICIES),
    "keep_snapshot": ("true or false", lambda v: isinstance(v, bool)),
    "pyxis_store": ("a non-empty string (a directory)",
                    lambda v: isinstance(v, str) and bool(v)),
    "pyxis_squashfs_only": ("true or false", lambda v: isinstance(v, bool)),
    "pyxis_compression": (DESCRIBED, lambda v: isinstance(v, str) and bool(Compression.parse(v))),
    "policy": ("a non-empty string (a containers-policy.json file)",
               lambda v: isinstance(v, str) and bool(v)),
    "registries_d": ("a non-empty string (a registries.d directory)",
                     lambda v: isinstance(v, str) and bool(v)),
    "policy_mandatory": ("true or false (read from the site file only)",
                         lambda v: isinstance(v, bool)),
    "registries": ('a table of registries: [registries."HOST[:PORT]"]',
                   lambda v: isinstance(v, dict)),
}
REGISTRY_KEYS: Mapping[str, tuple[str, Callable[[object], bool]]] = {
    "insecure": ("true or false", lambda v: isinstance(v, bool)),
    "mirrors": ('a list of URLs, e.g. ["https://mirror.example:5000"]', _is_url_list),
}


def _bad_value(path: Path, key: str, expected: str, value: object) -> UsageError:
    return UsageError(f"config file {path}: `{key}` must be {expected}, not {value!r}",
                      f"fix or remove `{key}` in {path}; every key is described in "
                      f"{CONFIG_DOC}")


def _unknown(path: Path, where: str, key: str, known: Sequence[str]) -> Notice:
    import difflib  # only for an unknown key

    close = difflib.get_close_matches(key, known, n=1)
    guess = f" (did you mean `{where}{close[0]}`?)" if close else ""
    return Notice(Kind.CONFIG,
                  f"config file {path}: unknown key `{where}{key}`{guess}; it is ignored")


def check_config(path: Path, data: Mapping[str, Any]) -> list[Notice]:
    """Check ``data`` read from ``path``: raise on a bad value, return unknown-key warnings."""
    warnings: list[Notice] = []
    for key, value in data.items():
        if key not in KEYS:
            warnings.append(_unknown(path, "", key, list(KEYS)))
            continue
        expected, check = KEYS[key]
        if not check(value):
            raise _bad_value(path, key, expected, value)
    for host, entry in data.get("registries", {}).items():
        where = f'registries."{host}"'
        if not isinstance(entry, dict):
            raise _bad_value(path, where, "a table (insecure = ..., mirrors = [...])", entry)
        for key, value in entry.items():
            if key not in REGISTRY_KEYS:
                warnings.append(_unknown(path, f"{where}.", key, list(REGISTRY_KEYS)))
                continue
            expected, check = REGISTRY_KEYS[key]
            if not check(value):
                raise _bad_value(path, f"{where}.{key}", expected, value)
    return warnings


def default_cache_dir() -> Path:
    """The cache when no option, variable or config file names one: ``$XDG_CACHE_HOME``'s
    (else ``~/.cache``'s) ``ocistage``."""
    return xdg_dir("XDG_CACHE_HOME", ".cache") / "ocistage"


#: a config file is a few hundred bytes; anything this large is not one
CONFIG_LIMIT = 1 << 20


def _read_toml(path: Path) -> dict[str, Any]:
    """The TOML document at ``path`` ({} when there is none), read as ssh reads its files: a
    regular file (a FIFO is refused, never waited on), of the caller or root, that nobody else
    can write, at most :data:`CONFIG_LIMIT` bytes, nested no deeper than the parser can go."""
    text = _config_text(path)
    if text is None:
        return {}
    import tomllib  # 2 ms of regexes, for users who have a config file

    try:
        return tomllib.loads(text)
    except RecursionError as exc:
        raise _config_error(path, "it is nested too deeply") from exc
    except ValueError as exc:  # tomllib's TOMLDecodeError
        raise _config_error(path, str(exc)) from exc


def _config_text(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _config_error(path, exc.strerror or str(exc)) from exc
    try:
        info = os.fstat(fd)
        problem = _config_problem(info)
        if problem:
            raise _config_error(path, problem, "chown/chmod it (chmod go-w), or remove it")
        data = os.read(fd, CONFIG_LIMIT + 1)
        while len(data) <= CONFIG_LIMIT and (more := os.read(fd, CONFIG_LIMIT + 1 - len(data))):
            data += more
    except OSError as exc:
        raise _config_error(path, exc.strerror or str(exc)) from exc
    finally:
        os.close(fd)
    if len(data) > CONFIG_LIMIT:
        raise _config_error(path, f"it is larger than {CONFIG_LIMIT >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _config_error(path, f"it is not UTF-8 ({exc.reason})") from exc


def _config_problem(info: os.stat_result) -> str | None:
    """The trust rule of docs/trust.md, for a file: the caller's or root's, and writable by
    nobody else (group write only by the owner's user-private group)."""
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    from ocistage.cache.dirtrust import trust_problem

    problem = trust_problem(os.stat_result((stat.S_IFDIR | stat.S_IMODE(info.st_mode),
                                            *tuple(info)[1:])))
    return f"it {problem}" if problem else None


def _config_error(path: Path, why: str, hint: str | None = None) -> UsageError:
    return UsageError(f"cannot read config file {path}: {why}",
                      hint or f"fix or remove the file; its format is described in {CONFIG_DOC}")


@dataclass
class _Layers:
    """The config files, site then user, each checked, and where each key was last set."""

    files: list[tuple[Path, dict[str, Any]]]
    warnings: list[Notice]

    @classmethod
    def read(cls) -> _Layers:
        files, warnings = [], []
        for path in (SITE_CONFIG, user_config_path()):
            data = _read_toml(path)
            warnings += check_config(path, data)
            files.append((path, data))
        return cls(files, warnings)

    def get(self, key: str) -> tuple[Any, str] | None:
        """The value of ``key`` and its origin, the user's file winning."""
        for path, data in reversed(self.files):
            if key in data:
                return data[key], f"file {path}"
        return None

    def site(self, key: str) -> Any:
        """The value of ``key`` in the site file (None if it does not set it)."""
        return self.files[0][1].get(key)

    def registries(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(host, origin, entry) for every registry table, site file first."""
        return [(host, f"file {path}", entry) for path, data in self.files
                for host, entry in data.get("registries", {}).items()]


def _first(*candidates: tuple[Any, str] | None) -> tuple[Any, str] | None:
    for candidate in candidates:
        if candidate is not None and candidate[0] not in (None, ""):
            return candidate
    return None


def _env(name: str) -> tuple[str, str] | None:
    value = os.environ.get(name)
    return (value, f"environment {name}") if value else None


def _flag(value: object, variable: str) -> bool:
    """A config file's boolean, or the variable's 1/true/yes or 0/false/no."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if (word := str(value).strip().lower()) not in ("1", "true", "yes", "0", "false", "no"):
        raise UsageError(f"${variable} is {value!r}", "set it to 1 (true) or 0 (false)")
    return word in ("1", "true", "yes")


def _option(value: Any, name: str) -> tuple[Any, str] | None:
    return (value, f"option {name}") if value is not None else None


def _size(chosen: tuple[Any, str] | None) -> int | None:
    if chosen is None:
        return None
    value, origin = chosen
    if isinstance(value, int):
        return value
    try:
        return parse_size(str(value))
    except UsageError as exc:
        raise UsageError(f"{exc.message} ({origin})", exc.hint) from exc


def _checked_jobs(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= MAX_JOBS:
        raise UsageError(f"--jobs must be from 1 to {MAX_JOBS}, not {value}")
    return value


def _checked_policy(policy: str | None, origin: str) -> str | None:
    if policy is not None and policy not in PULL_POLICIES:
        raise UsageError(f"invalid pull policy {policy!r} ({origin})",
                         f"use one of {', '.join(PULL_POLICIES)} (--pull, $OCISTAGE_PULL or "
                         "`pull` in the config file)")
    return policy


def load_settings(
    *,
    cache: Path | None = None,
    jobs: int | None = None,
    ca_file: str | None = None,
    insecure: Sequence[str] = (),
    mirrors: Sequence[str] = (),
    max_size: str | None = None,
    pull: str | None = None,
    keep_snapshot: bool | None = None,
    policy_file: str | None = None,
    registries_d: str | None = None,
) -> Settings:
    """Settings from options (arguments), environment and config files, in that precedence."""
    layers = _Layers.read()
    origins: dict[str, str] = {}

    def pick(name: str, *candidates: tuple[Any, str] | None) -> Any:
        chosen = _first(*candidates)
        origins[name] = chosen[1] if chosen else DEFAULT
        return chosen[0] if chosen else None

    cache_dir = pick("cache", _option(cache, "--cache"), _env("OCISTAGE_CACHE"),
                     layers.get("cache"))
    jobs_value = _checked_jobs(pick("jobs", _option(jobs, "--jobs"), layers.get("jobs")))
    policy = _checked_policy(pick("pull", _option(pull, "--pull"), _env("OCISTAGE_PULL"),
                                  layers.get("pull")), origins["pull"])
    size_choice = _first(_option(max_size, "--max-size"), _env("OCISTAGE_MAX_SIZE"),
                         layers.get("max_size"))
    origins["max_size"] = size_choice[1] if size_choice else DEFAULT
    unpack_choice = _first(_env("OCISTAGE_UNPACK_LIMIT"), layers.get("unpack_limit"))
    origins["unpack_limit"] = unpack_choice[1] if unpack_choice else DEFAULT
    stage_to = pick("stage_to", _env("OCISTAGE_STAGE_TO"), layers.get("stage_to"))
    chosen_ca = pick("ca_file", _option(ca_file, "--ca-file"), _env("OCISTAGE_CA_FILE"),
                     layers.get("ca_file"))
    loopback = pick("loopback_insecure", layers.get("loopback_insecure"))
    keep = pick("keep_snapshot",
                _option(keep_snapshot, "--keep-snapshot" if keep_snapshot else
                        "--no-keep-snapshot"), layers.get("keep_snapshot"))
    pyxis_store = pick("pyxis_store", _env("OCISTAGE_PYXIS_STORE"), layers.get("pyxis_store"))
    squashfs_only = _flag(pick("pyxis_squashfs_only", _env("OCISTAGE_PYXIS_SQUASHFS_ONLY"),
                               layers.get("pyxis_squashfs_only")), "OCISTAGE_PYXIS_SQUASHFS_ONLY")
    compression = pick("pyxis_compression", _env("OCISTAGE_PYXIS_COMPRESSION"),
                       layers.get("pyxis_compression"))
    insecure_hosts, mirror_map = registries(layers.registries(), insecure, mirrors,
                                            origins)
    policy_path = pick("policy", _option(policy_file, "--policy"), layers.get("policy"))
    registries_dir = pick("registries_d", _option(registries_d, "--registries.d"),
                          layers.get("registries_d"))
    mandatory = layers.site("policy_mandatory")
    origins["policy_mandatory"] = f"file {SITE_CONFIG}" if mandatory is not None else DEFAULT
    site_policy, site_registries = layers.site("policy"), layers.site("registries_d")

    return Settings(
        cache=Path(expand_user(cache_dir)) if cache_dir is not None else default_cache_dir(),
        jobs=jobs_value if jobs_value is not None else DEFAULT_JOBS,
        ca_file=str(chosen_ca) if chosen_ca is not None else None,
        insecure_registries=insecure_hosts,
        mirrors=mirror_map,
        loopback_insecure=loopback if loopback is not None else True,
        max_size=_size(size_choice),
        unpack_limit=_size(unpack_choice),
        stage_to=expand_user(stage_to) if stage_to and "://" not in stage_to
        else stage_to,
        pull=policy if policy is not None else "always",
        keep_snapshot=bool(keep),
        pyxis_store=Path(expand_user(pyxis_store)) if pyxis_store is not None else None,
        pyxis_squashfs_only=squashfs_only,
        pyxis_compression=str(compression) if compression is not None else None,
        policy=Path(expand_user(policy_path)) if policy_path is not None else None,
        registries_d=Path(expand_user(registries_dir)) if registries_dir is not None else None,
        policy_mandatory=bool(mandatory),
        site_policy=Path(site_policy) if site_policy is not None else None,
        site_registries_d=Path(site_registries) if site_registries is not None else None,
        origins=origins,
        warnings=tuple(layers.warnings),
    )
