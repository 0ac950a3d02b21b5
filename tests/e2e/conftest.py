"""Fixtures for end-to-end tests: real registries, fixture images, a fault proxy, the CLI.

Every test under tests/e2e is marked ``e2e``. A fixture needing a binary that is not on PATH
skips the test with the reason, or fails it under ``OCISTAGE_REQUIRE_E2E=1`` (set by .ci/run).

Session fixtures (started once, torn down at the end of the session):

- ``plain_registry``     anonymous, plain HTTP
- ``tls_registry``       anonymous, HTTPS with a private CA (``ca_file``, ``cert_dir``)
- ``htpasswd_registry``  basic auth (``username``/``password``), plain HTTP (distribution allows it)
- ``token_issuer`` and ``token_registry``: bearer-token auth; ``public/*`` repositories can be
  pulled anonymously, everything else needs ``TOKEN_USER``/``TOKEN_PASSWORD``
- ``fixture_layouts``    the OCI layout with the fixture images (cached across sessions)
- ``images``             name -> :class:`~tests.e2e.images.ImageRef` of every pushed image

Slurm (tests/e2e/slurm.py; session-scoped, private, stopped by pid at the end):
``slurm_22_05`` (Debian's 22.05, one node), ``slurm_24_05`` (24.05.8 built by
.ci/build-slurm.sh, nodes n1-n3 with a private node-local directory each), both a
:class:`~tests.e2e.slurm.SlurmCluster`; ``slurm_cluster`` (each of the two in turn);
``shared_dir`` (per test: a world-traversable directory every node sees); ``slurm_job_user``
(an unprivileged
:class:`~tests.e2e.slurm.JobUser`, removed at the end if the session created it).

Per test: ``fault_proxy`` (a :class:`~tests.e2e.faultproxy.FaultProxy` in front of
``plain_registry``), ``make_fault_proxy`` (one in front of any registry) and ``ocistage``
(runs the CLI with a private cache and HOME; ``ocistage.write_docker_auth(registry)``).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.components import (
    Registry,
    SigningKey,
    TlsMaterial,
    TokenAuth,
    e2e_required,
    make_signing_key,
    make_tls,
    require_binary,
    running_registry,
)
from tests.e2e.faultproxy import FaultProxy, running_fault_proxy
from tests.e2e.images import (
    FixtureLayouts,
    ImageRef,
    PushSpec,
    cache_root,
    fixture_layouts,
    push_all,
)
from tests.e2e.slurm import (
    JobUser,
    SlurmCluster,
    built_spec,
    debian_spec,
    job_user_account,
    session_cluster,
)
from tests.e2e.tokenissuer import TokenIssuer, running_token_issuer

__all__ = ["HTPASSWD_PASSWORD", "HTPASSWD_USER", "TOKEN_PASSWORD", "TOKEN_USER",
           "OcistageRunner", "require_binary"]

HTPASSWD_USER, HTPASSWD_PASSWORD = "basic-user", "basic-secret-1"
TOKEN_USER, TOKEN_PASSWORD = "token-user", "token-secret-1"
TOKEN_SERVICE, TOKEN_ISSUER = "ocistage-test-registry", "ocistage-test-issuer"
PUBLIC_REPOSITORIES = frozenset({"public/busybox"})

_E2E_DIR = Path(__file__).parent


def pytest_report_header() -> list[str]:
    """Which real components this run uses, so a CI log says what was tested against."""
    versions = []
    for argv in (["docker-registry", "--version"], ["skopeo", "--version"],
                 ["umoci", "--version"], ["runc", "--version"], ["crun", "--version"]):
        if shutil.which(argv[0]) is None:
            versions.append(f"{argv[0]}: missing")
            continue
        result = subprocess.run(argv, capture_output=True, text=True, timeout=10,
                                stdin=subprocess.DEVNULL, check=False)
        first = (result.stdout or result.stderr).strip().splitlines()
        versions.append(first[0] if first else f"{argv[0]}: ?")
    required = "required" if e2e_required() else "optional: tests needing a missing one skip"
    return [f"e2e components [{required}]: " + "; ".join(versions),
            f"e2e fixture image cache: {cache_root()}"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _E2E_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


# --- components -------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def e2e_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def tls_material(e2e_dir: Path) -> TlsMaterial:
    require_binary("openssl")
    return make_tls(e2e_dir / "tls")


@pytest.fixture(scope="session")
def signing_key(e2e_dir: Path) -> SigningKey:
    require_binary("openssl")
    return make_signing_key(e2e_dir / "token-key")


@pytest.fixture(scope="session")
def plain_registry(e2e_dir: Path) -> Iterator[Registry]:
    require_binary("docker-registry")
    with running_registry(e2e_dir / "registry-plain") as registry:
        yield registry


@pytest.fixture(scope="session")
def tls_registry(e2e_dir: Path, tls_material: TlsMaterial) -> Iterator[Registry]:
    require_binary("docker-registry")
    with running_registry(e2e_dir / "registry-tls", tls=tls_material) as registry:
        yield registry


@pytest.fixture(scope="session")
def htpasswd_registry(e2e_dir: Path) -> Iterator[Registry]:
    require_binary("docker-registry")
    require_binary("htpasswd")
    with running_registry(e2e_dir / "registry-htpasswd", username=HTPASSWD_USER,
                          password=HTPASSWD_PASSWORD) as registry:
        yield registry


@pytest.fixture(scope="session")
def token_issuer(signing_key: SigningKey) -> Iterator[TokenIssuer]:
    with running_token_issuer(signing_key, issuer=TOKEN_ISSUER, service=TOKEN_SERVICE,
                              users={TOKEN_USER: TOKEN_PASSWORD},
                              public=PUBLIC_REPOSITORIES) as issuer:
        yield issuer


@pytest.fixture(scope="session")
def token_registry(e2e_dir: Path, token_issuer: TokenIssuer,
                   signing_key: SigningKey) -> Iterator[Registry]:
    require_binary("docker-registry")
    auth = TokenAuth(realm=token_issuer.realm, service=TOKEN_SERVICE, issuer=TOKEN_ISSUER,
                     rootcertbundle=signing_key.cert)
    with running_registry(e2e_dir / "registry-token", token=auth, username=TOKEN_USER,
                          password=TOKEN_PASSWORD) as registry:
        yield registry


# --- images -----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def fixture_layouts_built() -> FixtureLayouts:
    require_binary("umoci")
    require_binary("skopeo")
    return fixture_layouts()


@pytest.fixture(scope="session")
def images(fixture_layouts_built: FixtureLayouts, e2e_dir: Path, plain_registry: Registry,
           tls_registry: Registry, htpasswd_registry: Registry,
           token_registry: Registry) -> dict[str, ImageRef]:
    """Every fixture image pushed where tests expect it, by name:

    ``busybox``, ``busybox-zstd``, ``busybox-v2s2``, ``multilayer``, ``multilayer-zstd``,
    ``multiarch`` (OCI index), ``multiarch-v2s2`` (Docker manifest list) (plain registry);
    ``tls/busybox``; ``htpasswd/busybox``;
    ``token/public`` (``public/busybox``) and ``token/private`` (``private/busybox``).
    """
    require_binary("skopeo")
    specs = [
        PushSpec("busybox", "busybox", plain_registry, "busybox"),
        PushSpec("busybox-zstd", "busybox-zstd", plain_registry, "busybox", "zstd"),
        PushSpec("busybox-v2s2", "busybox", plain_registry, "busybox", "v2s2",
                 ("--format", "v2s2")),
        PushSpec("multilayer", "multilayer", plain_registry, "multilayer"),
        PushSpec("multilayer-zstd", "multilayer-zstd", plain_registry, "multilayer",
                 "zstd"),
        PushSpec("multiarch", "multiarch", plain_registry, "multiarch"),
        PushSpec("multiarch-v2s2", "multiarch", plain_registry, "multiarch", "v2s2",
                 ("--format", "v2s2")),
        PushSpec("tls/busybox", "busybox", tls_registry, "busybox"),
        PushSpec("htpasswd/busybox", "busybox", htpasswd_registry, "private/busybox"),
        PushSpec("token/public", "busybox", token_registry, "public/busybox"),
        PushSpec("token/private", "busybox", token_registry, "private/busybox"),
    ]
    return push_all(specs, fixture_layouts_built, e2e_dir / "push")


@pytest.fixture
def fault_proxy(plain_registry: Registry) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of plain_registry (push images first via ``images``)."""
    with running_fault_proxy(plain_registry.url) as proxy:
        yield proxy


@pytest.fixture
def make_fault_proxy() -> Iterator[Callable[[Registry], FaultProxy]]:
    """A factory: a fault proxy (plain HTTP to the client) in front of any registry."""
    with ExitStack() as stack:
        yield lambda registry: stack.enter_context(
            running_fault_proxy(registry.url, registry.ca_file))


# --- Slurm ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def slurm_22_05() -> Iterator[SlurmCluster]:
    """Debian 12's Slurm 22.05: one node named after the host, private config and daemons."""
    with session_cluster(debian_spec(), ocistage_command()) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_24_05() -> Iterator[SlurmCluster]:
    """Slurm 24.05.8 built by .ci/build-slurm.sh: nodes n1-n3, each with its own node-local
    directory at ``cluster.node_local``; scrun in ``cluster.bin_dir``."""
    with session_cluster(built_spec(), ocistage_command()) as cluster:
        yield cluster


@pytest.fixture(params=["22.05", "24.05"])
def slurm_cluster(request: pytest.FixtureRequest) -> SlurmCluster:
    """Each test cluster in turn: the test runs once on 22.05 and once on 24.05."""
    name = "slurm_22_05" if request.param == "22.05" else "slurm_24_05"
    cluster: SlurmCluster = request.getfixturevalue(name)
    return cluster


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A world-traversable scratch directory under /tmp: on the shared filesystem of the test
    clusters' nodes, reachable by a job user; removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="ocistage-slurm-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_job_user() -> Iterator[JobUser]:
    """An unprivileged account for jobs (``ocistage-slurm``); removed at the end if made here."""
    with job_user_account() as user:
        yield user


# --- the CLI ----------------------------------------------------------------------------------

_SCRUBBED_ENV = ("DOCKER_CONFIG", "REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME",
                 "XDG_CACHE_HOME", "XDG_DATA_HOME", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
                 "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY")


def ocistage_command() -> list[str]:
    """The ``ocistage`` console script of this Python (its venv), else the one on PATH, else
    the CLI's ``main`` via this Python. Not simply the first on PATH: a pyenv shim or another
    checkout's install may come first when pytest runs with a venv's python not on PATH."""
    beside = Path(sys.executable).parent / "ocistage"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    script = shutil.which("ocistage")
    if script is not None:
        return [script]
    return [sys.executable, "-c", "from bundler.cli import main; main()"]


@dataclass(frozen=True)
class OcistageRunner:
    """Runs the CLI as a subprocess with a private cache, HOME and XDG dirs.

    The cache is passed as ``OCISTAGE_CACHE`` (the documented equivalent of ``--cache``), so
    it applies to every subcommand wherever the option sits. ``home`` is the child's HOME:
    tests write ``home/.docker/config.json`` there to exercise credentials.
    """

    command: tuple[str, ...]
    cache: Path
    home: Path
    cwd: Path

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in _SCRUBBED_ENV and not k.startswith("OCISTAGE_")}
        env.update({"HOME": str(self.home), "OCISTAGE_CACHE": str(self.cache),
                    "XDG_CACHE_HOME": str(self.home / ".cache"),
                    "XDG_CONFIG_HOME": str(self.home / ".config"),
                    "XDG_RUNTIME_DIR": str(self.home / "run"),
                    "NO_COLOR": "1", "COLUMNS": "200", "NO_PROXY": "127.0.0.1,localhost"})
        env.update(extra or {})
        return env

    def write_docker_auth(self, registry: Registry, username: str | None = None,
                          password: str | None = None) -> Path:
        """Add credentials for registry to ``home/.docker/config.json`` (what `docker login`
        writes); defaults to the registry's own username/password."""
        username = username if username is not None else registry.username
        password = password if password is not None else registry.password
        if username is None or password is None:
            raise ValueError(f"no credentials for {registry.host}")
        path = self.home / ".docker" / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        config = json.loads(path.read_text()) if path.exists() else {}
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        config.setdefault("auths", {})[registry.host] = {"auth": token}
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
        return path

    def __call__(self, *args: str, env: Mapping[str, str] | None = None,
                 input: str | None = None, timeout: float = 300,
                 check: bool = False) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*self.command, *args], env=self.environment(env),
                                cwd=self.cwd, input=input, capture_output=True, text=True,
                                timeout=timeout, stdin=None if input is not None
                                else subprocess.DEVNULL)
        if check and result.returncode != 0:
            pytest.fail(f"ocistage {' '.join(args)} exited {result.returncode}:\n"
                        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}", pytrace=False)
        return result


@pytest.fixture
def ocistage(tmp_path: Path) -> OcistageRunner:
    home = tmp_path / "home"
    (home / "run").mkdir(parents=True, mode=0o700)
    return OcistageRunner(command=tuple(ocistage_command()), cache=tmp_path / "cache",
                          home=home, cwd=tmp_path)
