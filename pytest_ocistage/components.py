"""Real `docker-registry` (CNCF distribution) processes on 127.0.0.1 for the pytest plugin.

Each registry gets its own temp directory holding its config, storage and log. A registry is a
context manager: entering starts the process and waits until ``/v2/`` answers, leaving stops it.

TLS material (a CA plus a server certificate for 127.0.0.1/localhost) and the key pair the
token issuer signs with are made with the ``openssl`` binary, so the tests need no Python
crypto package.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

import pytest

REGISTRY_BINARY = "docker-registry"
START_TIMEOUT = 20.0


@dataclass(frozen=True)
class Outcome:
    """What a command did: ``returncode`` (also ``exit_code``), stdout and stderr as text."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def exit_code(self) -> int:
        return self.returncode


class ComponentError(RuntimeError):
    """A test component (registry, openssl, skopeo, ...) could not be set up."""


@dataclass(frozen=True)
class TlsMaterial:
    """A private CA and a server certificate it signed for 127.0.0.1 and localhost."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    cert_dir: Path  # holds only ca.crt: what `skopeo --cert-dir` and docker's certs.d expect


@dataclass(frozen=True)
class SigningKey:
    """An RSA key and the self-signed certificate a registry trusts for token signatures."""

    key: Path
    cert: Path


@dataclass(frozen=True)
class TokenAuth:
    """The ``auth.token`` section of a registry config."""

    realm: str
    service: str
    issuer: str
    rootcertbundle: Path


@dataclass(frozen=True)
class Registry:
    """A running registry as tests see it."""

    host: str  # "127.0.0.1:PORT", the registry part of an image reference
    url: str  # "http://127.0.0.1:PORT" or "https://..."
    ca_file: Path | None  # CA that signed the server certificate (None: plain HTTP)
    cert_dir: Path | None  # directory with ca.crt, for skopeo --cert-dir
    username: str | None
    password: str | None
    storage: Path
    log_file: Path

    @property
    def tls(self) -> bool:
        return self.ca_file is not None

    def skopeo_flags(self, prefix: str = "", *, with_creds: bool = True) -> list[str]:
        """Transport flags for skopeo; prefix is "", "src-" or "dest-"."""
        flags = [f"--{prefix}tls-verify={'true' if self.tls else 'false'}"]
        if self.cert_dir is not None:
            flags.append(f"--{prefix}cert-dir={self.cert_dir}")
        if with_creds and self.username is not None and self.password is not None:
            flags.append(f"--{prefix}creds={self.username}:{self.password}")
        return flags

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.ca_file is None:
            return None
        return ssl.create_default_context(cafile=str(self.ca_file))


def _run(argv: list[str], what: str, cwd: Path | None = None) -> None:
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, cwd=cwd,
                       stdin=subprocess.DEVNULL, timeout=60)
    except subprocess.CalledProcessError as exc:
        raise ComponentError(f"{what} failed: {' '.join(argv)}\n{exc.stderr}") from exc


def make_tls(directory: Path) -> TlsMaterial:
    """Create a CA and a server certificate (SAN 127.0.0.1, ::1, localhost) in directory."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.pem"
    ext = directory / "server.ext"
    _run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "2",
          "-subj", "/CN=ocistage test CA", "-keyout", str(ca_key), "-out", str(ca_cert),
          "-addext", "basicConstraints=critical,CA:TRUE",
          "-addext", "keyUsage=critical,keyCertSign,cRLSign"], "creating the test CA")
    _run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-sha256",
          "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr)],
         "creating the server key")
    ext.write_text("basicConstraints=CA:FALSE\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth\n"
                   "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\n")
    _run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
          "-CAcreateserial", "-days", "2", "-sha256", "-extfile", str(ext), "-out", str(cert)],
         "signing the server certificate")
    cert_dir = directory / "certs.d"
    cert_dir.mkdir(exist_ok=True)
    (cert_dir / "ca.crt").write_bytes(ca_cert.read_bytes())
    return TlsMaterial(ca_cert, ca_key, cert, key, cert_dir)


def make_signing_key(directory: Path) -> SigningKey:
    """Create the RSA key + self-signed certificate that a token registry trusts."""
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / "token.key", directory / "token.pem"
    _run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "2",
          "-subj", "/CN=ocistage test token issuer", "-keyout", str(key), "-out", str(cert)],
         "creating the token signing key")
    return SigningKey(key, cert)


def make_htpasswd(path: Path, username: str, password: str) -> None:
    """Write an htpasswd file with one bcrypt entry (the only format distribution accepts)."""
    _run(["htpasswd", "-B", "-b", "-c", str(path), username, password], "writing htpasswd")


#: ports handed out by :func:`free_port` in this process: a daemon binds its port only later,
#: so a second call must not pick the same one meanwhile
_HANDED_OUT: set[int] = set()
_LOWEST_PORT = 10000


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A loopback TCP port nothing listens on, for a daemon that binds it later.

    Outside the kernel's ephemeral range: a port the kernel hands out (bind to 0) may be
    taken by any outgoing connection before the daemon binds it, as a slurmd in CI once
    found ("Unable to bind listen port"). Below the range, only another listener can take
    it, and those are the tests' own, which this process hands out once each.
    """
    low, high = _ephemeral_range()
    candidates = [n for n in range(_LOWEST_PORT, low) if n not in _HANDED_OUT] \
        or [n for n in range(high + 1, 65536) if n not in _HANDED_OUT]
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded host
        sock.bind(("127.0.0.1", 0))
        found: int = sock.getsockname()[1]
    _HANDED_OUT.add(found)
    return found


def registry_config(storage: Path, port: int, *, tls: TlsMaterial | None = None,
                    htpasswd: Path | None = None, token: TokenAuth | None = None,
                    proxy_remote: str | None = None) -> dict[str, object]:
    """The registry configuration as a dict (written as JSON, which YAML parsers accept).

    proxy_remote: a pull-through cache of that registry URL (``proxy: remoteurl:``)."""
    http: dict[str, object] = {
        "addr": f"127.0.0.1:{port}",
        "secret": "ocistage-test-secret",
        "headers": {"X-Content-Type-Options": ["nosniff"]},
    }
    if tls is not None:
        http["tls"] = {"certificate": str(tls.server_cert), "key": str(tls.server_key)}
    config: dict[str, object] = {
        "version": "0.1",
        "log": {"level": "info", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(storage)},
                    "delete": {"enabled": True},
                    "maintenance": {"uploadpurging": {"enabled": False}}},
        "http": http,
    }
    if proxy_remote is not None:
        config["proxy"] = {"remoteurl": proxy_remote}
    if htpasswd is not None and token is not None:
        raise ValueError("a registry has one auth scheme: htpasswd or token")
    if htpasswd is not None:
        config["auth"] = {"htpasswd": {"realm": "ocistage-test", "path": str(htpasswd)}}
    if token is not None:
        config["auth"] = {"token": {"realm": token.realm, "service": token.service,
                                    "issuer": token.issuer,
                                    "rootcertbundle": str(token.rootcertbundle)}}
    return config


def listening_socket_inodes(port: int) -> set[str]:
    """Inodes of the TCP sockets listening on port (from /proc/net/tcp and tcp6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(fields[9])
    return inodes


def owns_listener(pid: int, port: int) -> bool:
    """Whether process pid holds the socket listening on port (not another session's)."""
    wanted = listening_socket_inodes(port)
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(fd_dir / fd)
        except OSError:  # closed meanwhile (e.g. the descriptor listdir itself used)
            continue
        if link.startswith("socket:[") and link[8:-1] in wanted:
            return True
    return False


def http_status(url: str, context: ssl.SSLContext | None, timeout: float = 2.0) -> int:
    """Status of a GET to url (no proxies, no redirects); raises OSError if unreachable."""
    parts = urlsplit(url)
    conn = (http.client.HTTPSConnection(parts.netloc, timeout=timeout, context=context)
            if parts.scheme == "https"
            else http.client.HTTPConnection(parts.netloc, timeout=timeout))
    try:
        conn.request("GET", parts.path or "/")
        response = conn.getresponse()
        response.read()
        return response.status
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer from {url}: {exc}") from exc
    finally:
        conn.close()


def wait_for_http(url: str, context: ssl.SSLContext | None, process: subprocess.Popen[bytes],
                  log_file: Path, timeout: float = START_TIMEOUT) -> None:
    """Wait until process listens on url's port and url answers with any HTTP status.

    Fails early if the process died (e.g. its port was taken by a concurrent test session
    between probing and binding); checking that the listener is ours means a registry of
    another session on the same port is never mistaken for this one.
    """
    port = urlsplit(url).port or 0
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise ComponentError(f"registry exited with {process.returncode}:\n"
                                 f"{log_file.read_text(errors='replace')[-4000:]}")
        try:
            if owns_listener(process.pid, port):
                http_status(url, context)  # 200, or 401 from an auth-enabled registry
                return
            problem = f"no listener of pid {process.pid} on port {port} yet"
        except OSError as exc:
            problem = str(exc)
        if time.monotonic() > deadline:
            raise ComponentError(f"{url} did not answer within {timeout}s: {problem}")
        time.sleep(0.05)


@contextmanager
def running_registry(workdir: Path, *, tls: TlsMaterial | None = None,
                     username: str | None = None, password: str | None = None,
                     token: TokenAuth | None = None,
                     proxy_remote: str | None = None) -> Iterator[Registry]:
    """Start a docker-registry in workdir; htpasswd auth when username/password are given;
    a pull-through cache of the registry at URL proxy_remote if given.

    For a token registry, username/password are the credentials the token issuer accepts
    (they are only carried along for the tests' convenience).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    storage = workdir / "storage"
    storage.mkdir(exist_ok=True)
    htpasswd = None
    if username is not None and password is not None and token is None:
        htpasswd = workdir / "htpasswd"
        make_htpasswd(htpasswd, username, password)
    log_file = workdir / "registry.log"
    last_error: ComponentError | None = None
    for _attempt in range(5):  # a free port can be taken between probing and binding
        port = free_port()
        config_file = workdir / "config.yml"
        config = registry_config(storage, port, tls=tls, htpasswd=htpasswd, token=token,
                                 proxy_remote=proxy_remote)
        config_file.write_text(json.dumps(config, indent=2))
        scheme = "https" if tls is not None else "http"
        registry = Registry(host=f"127.0.0.1:{port}", url=f"{scheme}://127.0.0.1:{port}",
                            ca_file=tls.ca_cert if tls is not None else None,
                            cert_dir=tls.cert_dir if tls is not None else None,
                            username=username, password=password, storage=storage,
                            log_file=log_file)
        with log_file.open("ab") as log:
            env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
            process = subprocess.Popen([REGISTRY_BINARY, "serve", str(config_file)],
                                       stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, env=env,
                                       preexec_fn=die_with_parent)
        try:
            try:
                wait_for_http(f"{registry.url}/v2/", registry.ssl_context(), process, log_file)
            except ComponentError as exc:
                last_error = exc
                continue
            yield registry
            return
        finally:
            stop_process(process)
    raise ComponentError(f"could not start a registry in {workdir}: {last_error}")


def die_with_parent() -> None:
    """preexec_fn of every daemon a fixture starts: the kernel sends it SIGTERM when the test
    session dies, however it dies (SIGTERM, SIGKILL, a crash), so no registry or Slurm daemon
    outlives the run that started it (``PR_SET_PDEATHSIG``; the fixtures start them from the
    session's main thread, whose end is the process's)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# where a binary the fixtures run comes from on Debian (apt-get install PACKAGE)
DEBIAN_PACKAGES = {
    "docker-registry": "docker-registry", "skopeo": "skopeo", "umoci": "umoci", "runc": "runc",
    "crun": "crun", "openssl": "openssl", "htpasswd": "apache2-utils",
    "busybox": "busybox-static", "mksquashfs": "squashfs-tools",
    "unsquashfs": "squashfs-tools", "squashfuse": "squashfuse", "squashfuse_ll": "squashfuse",
    "fusermount3": "fuse3", "lua5.3": "lua5.3",
    "rsync": "rsync", "zstd": "zstd", "curl": "curl", "jq": "jq", "newuidmap": "uidmap",
    "sinfo": "slurm-client", "srun": "slurm-client", "sbatch": "slurm-client",
    "scontrol": "slurm-client", "squeue": "slurm-client", "slurmctld": "slurmctld",
    "slurmd": "slurmd", "munged": "munge", "podman": "podman", "setpriv": "util-linux",
    "runuser": "util-linux", "useradd": "passwd", "gpg": "gnupg", "gpgconf": "gnupg",
    "gpgv": "gpgv", "groupadd": "passwd", "groupdel": "passwd", "userdel": "passwd",
    "man": "man-db", "make": "make", "tar": "tar", "bash": "bash", "chattr": "e2fsprogs",
    "git": "git", "gzip": "gzip", "sha256sum": "coreutils", "tee": "coreutils",
}
REQUIRE_ENV = "OCISTAGE_REQUIRE_E2E"


def e2e_required() -> bool:
    """True under OCISTAGE_REQUIRE_E2E=1 (CI; pytest's ``--ocistage-require`` sets it): a
    missing component fails instead of skipping."""
    return os.environ.get(REQUIRE_ENV, "") == "1"


def component_unavailable(reason: str) -> NoReturn:
    """Skip the test with reason, or fail it when components are required."""
    if e2e_required():
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: required)", pytrace=False)
    pytest.skip(reason)


#: the one reason every test marked ``needs_root`` is skipped with when not run as root
NEEDS_ROOT_REASON = "needs root (marked needs_root): root-only tests run when pytest runs as root"


def running_as_root() -> bool:
    """Whether this process is root (effective uid 0): the one test of the tests' identity."""
    return os.geteuid() == 0


def require_root() -> None:
    """Skip the test when not root, always with :data:`NEEDS_ROOT_REASON`.

    Never a failure, not even under OCISTAGE_REQUIRE_E2E=1: a user's run (a developer's
    ``make test``, CI's run as a created user) skips what only root can do, while root's run
    includes it. Use the ``needs_root`` marker on a test; this function is for fixtures."""
    if not running_as_root():
        pytest.skip(NEEDS_ROOT_REASON)


def require_binary(name: str, package: str | None = None) -> str:
    """The path of binary name; skip the test naming the Debian package that ships it (fail
    under OCISTAGE_REQUIRE_E2E=1 or ``--ocistage-require``) if absent."""
    path = shutil.which(name)
    if path is None:
        package = package or DEBIAN_PACKAGES.get(name, name)
        component_unavailable(
            f"{name} not found on PATH: install the Debian package {package} "
            f"(apt-get install {package}); OCISTAGE_REQUIRE_E2E=1 or --ocistage-require "
            "turns this skip into a failure")
    return path
