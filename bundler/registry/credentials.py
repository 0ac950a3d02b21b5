"""Registry credentials from docker and containers auth files and credential helpers.

Files are searched in this order, the first one with an entry for the registry wins:
``$REGISTRY_AUTH_FILE``, ``$XDG_RUNTIME_DIR/containers/auth.json``,
``~/.config/containers/auth.json``, ``$DOCKER_CONFIG/config.json`` (or ``~/.docker/config.json``).
Within a file: ``credHelpers[host]``, then ``auths`` (most specific key first: containers
allows ``host/namespace/repo`` keys), then the default ``credsStore`` helper. A missing or
failing helper means "no credentials" (logged at debug level), never a crash; an auth file
that does not parse is an :class:`AuthenticationError` naming the file.

Every file is read by :func:`read_credentials_file`: one ``open`` (``O_NOFOLLOW |
O_NONBLOCK``), then ``fstat`` of the descriptor: a symlink, a FIFO or anything but a regular
file, or a file of another user (not the caller's or root's), is skipped with a warning and
never waited for. ``$XDG_RUNTIME_DIR/containers/auth.json`` is reached through directory
descriptors from ``$XDG_RUNTIME_DIR``, each directory the caller's (or root's) and not
writable by others: a runtime directory that was missing when the environment was read and
is made by someone else before the lookup is not used (docs/trust.md).
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
import logging
import os
import re
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ocistage.bundler.registry.errors import AuthenticationError
from ocistage.cache.readback import READ_FLAGS, file_problem, read_capped
from ocistage.cache.userdirs import home_dir as user_home

log = logging.getLogger(__name__)

DOCKER_HUB_ALIASES = ("docker.io", "index.docker.io", "registry-1.docker.io")
DOCKER_HUB_SERVER_URL = "https://index.docker.io/v1/"
HELPER_TIMEOUT = 60.0
_TOKEN_USERNAME = "<token>"
#: an auth file larger than this is refused (it holds a few entries)
MAX_AUTH_FILE = 4 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Credentials:
    """A username/password pair, or an identity (refresh) token for the OAuth2 flow."""

    username: str
    password: str = field(repr=False)
    identity_token: str | None = field(default=None, repr=False)


def normalize_key(key: str) -> str:
    """``https://index.docker.io/v1/`` -> ``index.docker.io``; ``host/ns/`` -> ``host/ns``."""
    text = key.strip()
    for prefix in ("https://", "http://"):
        if text.lower().startswith(prefix):
            text = text[len(prefix):]
            break
    text = text.rstrip("/")
    for suffix in ("/v1", "/v2"):
        if text.endswith(suffix) and "/" not in text[: -len(suffix)]:
            text = text[: -len(suffix)]
    return text


def _candidate_keys(registry: str, repository: str | None) -> list[str]:
    """Keys to look up, most specific first (``host/a/b``, ``host/a``, ``host``)."""
    hosts = list(DOCKER_HUB_ALIASES) if registry in DOCKER_HUB_ALIASES else [registry]
    keys: list[str] = []
    parts = repository.split("/") if repository else []
    for count in range(len(parts), 0, -1):
        keys.extend(f"{host}/{'/'.join(parts[:count])}" for host in hosts)
    keys.extend(hosts)
    return keys


def _server_url(registry: str) -> str:
    """The server address docker passes to credential helpers."""
    return DOCKER_HUB_SERVER_URL if registry in DOCKER_HUB_ALIASES else registry


#: what ``docker-credential-<name>`` may be: a name to look up on PATH, never a path
_HELPER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)


def run_helper(name: str, server_url: str, environ: Mapping[str, str] | None = None,
               ) -> Credentials | None:
    """Ask ``docker-credential-<name> get`` for credentials; None if it has none or fails.

    ``name`` comes from an auth file: only a plain program suffix is run (letters, digits,
    ``.``, ``_``, ``-``), looked up on PATH, never a path (``../x``) or anything else."""
    program = f"docker-credential-{name}"
    if not _HELPER_NAME.fullmatch(name):
        log.warning("credential helper name %r is not a plain name: not run", name)
        return None
    try:
        result = subprocess.run([program, "get"], input=server_url.encode(),
                                capture_output=True, timeout=HELPER_TIMEOUT, check=False,
                                env=dict(environ) if environ is not None else None)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("credential helper %s unusable: %s", program, exc)
        return None
    if result.returncode != 0:
        log.debug("credential helper %s has no credentials for %s: %s", program, server_url,
                  result.stdout.decode(errors="replace").strip()
                  or result.stderr.decode(errors="replace").strip())
        return None
    try:
        reply = json.loads(result.stdout)
        username, secret = reply["Username"], reply["Secret"]
    except (ValueError, KeyError, TypeError) as exc:
        log.debug("credential helper %s gave an unreadable answer: %s", program, exc)
        return None
    if not isinstance(username, str) or not isinstance(secret, str) or not secret:
        log.debug("credential helper %s gave no usable secret", program)
        return None
    if username == _TOKEN_USERNAME:
        return Credentials(username="", password="", identity_token=secret)
    return Credentials(username=username, password=secret)


class SkippedFile(Exception):
    """A credentials file that is there but not read: ``reason`` says why; ``special``: it is
    a FIFO, socket, device or directory (which enroot skips without a word)."""

    def __init__(self, reason: str, special: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.special = special


def _check_directory(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if st.st_uid not in (os.geteuid(), 0):
        raise SkippedFile(f"{path} is owned by uid {st.st_uid}, not by you or root")
    if st.st_mode & 0o022:
        raise SkippedFile(f"{path} is writable by others")


def read_credentials_file(path: Path, within: Path | None = None,
                          limit: int = MAX_AUTH_FILE) -> bytes | None:
    """The bytes of the credentials file ``path`` (relative to the directory ``within`` when
    given, reached through directory descriptors), or None if there is none.

    One open, never through a symlink at the last component and never waiting (a FIFO opens
    at once), then ``fstat`` of the descriptor: what is not a regular file of the caller or
    root raises :class:`SkippedFile`. ``within`` and each directory below it must be the
    caller's or root's and not writable by others (else :class:`SkippedFile`). Raises OSError
    as ``open`` does and ValueError for a file larger than ``limit``.
    """
    shown = within / path if within is not None else path
    dir_fd: int | None = None
    try:
        name: str | Path = path
        if within is not None:
            dir_fd = os.open(within, _DIR_FLAGS)
            _check_directory(dir_fd, within)
            for depth, part in enumerate(path.parts[:-1], start=1):
                inner = os.open(part, _DIR_FLAGS, dir_fd=dir_fd)
                os.close(dir_fd)
                dir_fd = inner
                _check_directory(dir_fd, within.joinpath(*path.parts[:depth]))
            name = path.name
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SkippedFile(f"{shown} is a symbolic link") from exc
        if exc.errno == errno.ENOTDIR:  # a file where a directory is named: no auth file
            return None
        raise
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    try:
        st = os.fstat(fd)
        problem = file_problem(st, "ours")
        if problem is not None:
            raise SkippedFile(f"{shown} {problem}", not stat.S_ISREG(st.st_mode))
        return read_capped(fd, limit)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class AuthFile:
    """One docker ``config.json`` or containers ``auth.json``; read at lookup time.
    ``within``: the directory ``path`` is relative to, every directory from it to the file
    checked on its descriptor (``$XDG_RUNTIME_DIR``)."""

    path: Path
    within: Path | None = None

    @property
    def full_path(self) -> Path:
        return self.within / self.path if self.within is not None else self.path

    def _load(self) -> dict[str, Any] | None:
        try:
            data = read_credentials_file(self.path, self.within)
        except SkippedFile as skipped:
            log.warning("%s; not reading it for registry credentials", skipped.reason)
            return None
        except OSError as exc:
            raise AuthenticationError(f"cannot read auth file {self.full_path}: "
                                      f"{exc.strerror}", "fix its permissions or remove it"
                                      ) from exc
        except ValueError as exc:
            raise AuthenticationError(f"auth file {self.full_path} is {exc}",
                                      "fix the file or log in again") from exc
        if data is None:
            return None
        try:
            text = data.decode("utf-8")
            document = json.loads(text) if text.strip() else {}
        except ValueError as exc:
            raise AuthenticationError(f"auth file {self.full_path} is not valid JSON: {exc}",
                                      "fix the file or log in again") from exc
        if not isinstance(document, dict):
            raise AuthenticationError(f"auth file {self.full_path} is not a JSON object",
                                      "fix the file or log in again")
        return document

    def lookup(self, registry: str, repository: str | None,
               environ: Mapping[str, str] | None = None) -> Credentials | None:
        document = self._load()
        if document is None:
            return None
        helpers = document.get("credHelpers")
        if isinstance(helpers, dict):
            normalized = {normalize_key(str(k)): v for k, v in helpers.items()}
            for key in _candidate_keys(registry, None):
                name = normalized.get(key)
                if isinstance(name, str) and name:
                    return run_helper(name, _server_url(registry), environ)
        auths = document.get("auths")
        if isinstance(auths, dict):
            entries = {normalize_key(str(k)): v for k, v in auths.items()}
            for key in _candidate_keys(registry, repository):
                entry = entries.get(key)
                if isinstance(entry, dict):
                    found = self._entry(entry, key)
                    if found is not None:
                        return found
        store = document.get("credsStore")
        if isinstance(store, str) and store:
            return run_helper(store, _server_url(registry), environ)
        return None

    def _entry(self, entry: Mapping[str, Any], key: str) -> Credentials | None:
        token = entry.get("identitytoken")
        identity = token if isinstance(token, str) and token else None
        username, password = entry.get("username"), entry.get("password")
        encoded = entry.get("auth")
        if isinstance(encoded, str) and encoded:
            try:
                decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError) as exc:
                raise AuthenticationError(
                    f"the auth entry for {key} in {self.full_path} is not valid base64",
                    "log in again to rewrite it") from exc
            username, sep, password = decoded.partition(":")
            if not sep:
                raise AuthenticationError(
                    f"the auth entry for {key} in {self.full_path} is not user:password",
                    "log in again to rewrite it")
        if isinstance(username, str) and isinstance(password, str) and (username or password):
            return Credentials(username, password, identity)
        if identity is not None:
            return Credentials(username if isinstance(username, str) else "", "", identity)
        return None


class CredentialStore:
    """Credentials for registries, looked up in auth files in order (first match wins)."""

    def __init__(self, files: Sequence[Path | AuthFile],
                 environ: Mapping[str, str] | None = None) -> None:
        self._files = [f if isinstance(f, AuthFile) else AuthFile(Path(f)) for f in files]
        self._environ = environ

    @property
    def files(self) -> list[Path]:
        return [f.full_path for f in self._files]

    @property
    def auth_files(self) -> list[AuthFile]:
        return list(self._files)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None,
                         home: Path | None = None) -> CredentialStore:
        env = os.environ if environ is None else environ
        home_dir = home if home is not None else user_home(env)
        files: list[AuthFile] = []
        if env.get("REGISTRY_AUTH_FILE"):
            files.append(AuthFile(Path(env["REGISTRY_AUTH_FILE"])))
        if env.get("XDG_RUNTIME_DIR"):
            runtime = Path(env["XDG_RUNTIME_DIR"])
            if runtime.is_absolute():  # whose it is: checked on its descriptor when read
                files.append(AuthFile(Path("containers", "auth.json"), within=runtime))
        files.append(AuthFile(home_dir / ".config" / "containers" / "auth.json"))
        if env.get("DOCKER_CONFIG"):
            files.append(AuthFile(Path(env["DOCKER_CONFIG"]) / "config.json"))
        else:
            files.append(AuthFile(home_dir / ".docker" / "config.json"))
        return cls(files, environ)

    def lookup(self, registry: str, repository: str | None = None) -> Credentials | None:
        """Credentials for ``registry`` (``host[:port]``), optionally for one repository."""
        for auth_file in self._files:
            found = auth_file.lookup(registry, repository, self._environ)
            if found is not None:
                return found
        return None
