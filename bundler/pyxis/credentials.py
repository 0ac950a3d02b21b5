"""Registry credentials as enroot reads them: its ``.credentials`` netrc beside the docker
and podman auth files ocistage reads."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ocistage.bundler.errors import PyxisImportError
from ocistage.bundler.registry.credentials import (
    DOCKER_HUB_ALIASES,
    Credentials,
    CredentialStore,
    SkippedFile,
    read_credentials_file,
)
from ocistage.cache.userdirs import home_dir, owned_by_caller

log = logging.getLogger(__name__)

NETRC_NAME = ".credentials"
_ENV_REF_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class NetrcEntry:
    machine: str
    login: str
    password: str = dataclasses.field(repr=False)


def enroot_config_dir(environ: Mapping[str, str]) -> Path:
    """enroot's ``$ENROOT_CONFIG_PATH`` (default ``$XDG_CONFIG_HOME/enroot``, else
    ``~/.config/enroot``); pyxis removes ``ENROOT_*`` from the importer's environment, so
    usually the default."""
    configured = environ.get("ENROOT_CONFIG_PATH")
    if configured and os.path.isabs(configured):
        return Path(configured)
    xdg = environ.get("XDG_CONFIG_HOME")
    if xdg and os.path.isabs(xdg) and owned_by_caller(Path(xdg)):
        return Path(xdg) / "enroot"
    return home_dir(environ) / ".config" / "enroot"


def parse_netrc(text: str, environ: Mapping[str, str], where: str) -> list[NetrcEntry]:
    """The ``machine HOST login USER password PASS`` lines of enroot's ``.credentials``.

    A password ``$NAME`` or ``${NAME}`` is taken from the environment, as enroot does; enroot
    runs anything else starting with ``$`` (``$(command)``) through a shell, which this refuses.
    """
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) < 6 or words[0] != "machine" or words[2] != "login" or words[4] != "password":
            continue
        password = " ".join(words[5:])
        if password.startswith("$"):
            password = _expand(password, environ, f"{where}:{number}")
        entries.append(NetrcEntry(words[1], words[3], password))
    return entries


def _expand(value: str, environ: Mapping[str, str], where: str) -> str:
    match = _ENV_REF_RE.fullmatch(value)
    if match is None:
        raise PyxisImportError(
            f"{where}: the password {value[:20]!r}... runs a command in enroot's shell",
            "ocistage runs no commands from the credentials file: put the secret in an "
            "environment variable and write `password $NAME`, or use ~/.docker/config.json")
    name = match.group(1) or match.group(2)
    if name not in environ:
        raise PyxisImportError(f"{where}: the password names ${name}, which is not set",
                               f"export {name} in the job's environment")
    return environ[name]


def _machines(registry: str) -> tuple[str, ...]:
    """The netrc machine names of a registry: its host without the port (as enroot matches
    it), and for docker.io the names enroot uses for it."""
    host = registry.rsplit(":", 1)[0] if not registry.endswith("]") else registry
    return DOCKER_HUB_ALIASES if host in DOCKER_HUB_ALIASES else (host,)


class EnrootCredentials(CredentialStore):
    """The auth files ocistage reads (docker, podman), plus enroot's ``.credentials``.

    With a user in the URI (``USER@REGISTRY#IMAGE``) that user's netrc entry is used first;
    without one, the auth files first, then the first netrc entry for the registry (enroot
    infers the user the same way).
    """

    def __init__(self, user: str | None, environ: Mapping[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        base = CredentialStore.from_environment(env)
        super().__init__(base.auth_files, env)
        self.user = user
        self.netrc = enroot_config_dir(env) / NETRC_NAME
        self._env = env
        self._entries: list[NetrcEntry] | None = None

    def entries(self) -> list[NetrcEntry]:
        if self._entries is None:
            self._entries = parse_netrc(_read_netrc(self.netrc), self._env, str(self.netrc))
        return self._entries

    def lookup(self, registry: str, repository: str | None = None) -> Credentials | None:
        machines = _machines(registry)
        if self.user is not None:
            for entry in self.entries():
                if entry.machine in machines and entry.login == self.user:
                    return Credentials(entry.login, entry.password)
        found = super().lookup(registry, repository)
        if found is not None:
            return found
        for entry in self.entries():
            if entry.machine in machines:
                return Credentials(entry.login, entry.password)
        return None


def _read_netrc(path: Path, limit: int = 1 << 20) -> str:
    """The text of enroot's ``.credentials`` (read as the auth files are:
    :func:`~ocistage.bundler.registry.credentials.read_credentials_file`); empty if there is
    none. A FIFO or other special file is skipped without a word, as enroot skips it; a
    symlink or another user's file with a warning (enroot would read them)."""
    try:
        data = read_credentials_file(path, limit=limit)
    except SkippedFile as skipped:
        if not skipped.special:
            log.warning("%s; not reading it for registry credentials", skipped.reason)
        return ""
    except ValueError as exc:
        raise PyxisImportError(f"{path} is {exc}", "a credentials file holds a few lines"
                               ) from exc
    except OSError as exc:
        raise PyxisImportError(f"cannot read {path}: {exc.strerror}",
                               "fix its permissions or remove it") from exc
    return "" if data is None else data.decode("utf-8", errors="replace")
