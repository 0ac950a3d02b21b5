"""The ocistage pytest plugin: real registries, images, the CLI and runtimes as fixtures.

Installed with ocistage (entry point ``pytest11: ocistage``), so any pytest run where ocistage
is installed has these fixtures; docs/testing.md shows them in use. A fixture that needs a
binary that is not on PATH skips the test naming the Debian package to install, or fails it
under ``OCISTAGE_REQUIRE_E2E=1`` or ``pytest --ocistage-require``.

Session fixtures (started once, stopped by pid at the end of the session):

- ``oci_registry``             ``docker-registry`` on a free 127.0.0.1 port, anonymous, HTTP
- ``oci_registry_tls``         HTTPS with a private CA (``.ca_file``, ``.cert_dir``)
- ``oci_registry_basic_auth``  htpasswd auth (``.username``/``.password``)
- ``oci_registry_token``       bearer tokens from ``oci_token_issuer``: ``public/...``
  repositories pull anonymously, everything else needs ``.username``/``.password``

Per test:

- ``oci_registry_factory(tls=False, username=None, password=None)``: a private registry,
  stopped at the end of the test
- ``oci_image(layers, **config)``: build an image (:func:`~pytest_ocistage.imagebuild.
  build_image`) into the test's OCI layout; ``.ref`` is ``oci:...``, ``.push(registry,
  "repo")`` and ``.write_archive(path)`` publish it
- ``ocistage_cache``: a private cache directory (``OCISTAGE_CACHE`` of the runner)
- ``ocistage``: an :class:`~pytest_ocistage.runner.OcistageRunner` with a private HOME and
  config: ``ocistage("bundle", ref, "--json").json``
- ``run_bundle(bundle, runtime=None)``: run a bundle under rootless runc or crun (None: the
  first that can run it for this user)
- ``fault_proxy``: a :class:`~pytest_ocistage.faultproxy.FaultProxy` in front of
  ``oci_registry``; ``make_fault_proxy(registry)`` puts one in front of any registry

Slurm (root only; private config, munged and daemons on their own ports, stopped by pid at the
end of the session; see pytest_ocistage/slurm.py for the :class:`SlurmCluster` API):

- ``slurm_22_05``: Debian's Slurm 22.05, one node
- ``slurm_24_05``: Slurm 24.05.8 built from source (``$OCISTAGE_SLURM_PREFIX``), nodes n1-n3,
  each with its own node-local directory, and ``scrun``
- ``slurm_26_05``: Slurm 26.05.3 built from source with PMIx
  (``$OCISTAGE_SLURM_26_05_PREFIX``), nodes n1-n3 as for 24.05
- ``slurm_cluster``: each of the three in turn (the test runs once on each)
- ``slurm_nodes``: each three-node cluster in turn (24.05, 26.05)
- ``shared_dir``: a world-traversable directory every node sees; ``slurm_job_user``: an
  unprivileged account for jobs, removed at the end if the session made it
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from pytest_ocistage.bundles import BundleRun
from pytest_ocistage.bundles import run_bundle as run_bundle_in
from pytest_ocistage.clusterspec import built_spec, debian_spec
from pytest_ocistage.components import (
    NEEDS_ROOT_REASON,
    REQUIRE_ENV,
    Registry,
    SigningKey,
    TlsMaterial,
    TokenAuth,
    make_signing_key,
    make_tls,
    require_binary,
    running_as_root,
    running_registry,
)
from pytest_ocistage.faultproxy import FaultProxy, running_fault_proxy
from pytest_ocistage.imagebuild import BuiltImage, LayerSource, build_image
from pytest_ocistage.jobuser import JobUser, job_user_account
from pytest_ocistage.runner import OcistageRunner, ocistage_command
from pytest_ocistage.slurm import SlurmCluster, session_cluster
from pytest_ocistage.tokenissuer import TokenIssuer, running_token_issuer

BASIC_USER, BASIC_PASSWORD = "basic-user", "basic-secret-1"
TOKEN_USER, TOKEN_PASSWORD = "token-user", "token-secret-1"
TOKEN_SERVICE, TOKEN_ISSUER = "ocistage-test-registry", "ocistage-test-issuer"
PUBLIC_REPOSITORIES = frozenset({"public/"})  # every repository under public/

_SAVED_REQUIRE = pytest.StashKey[str | None]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ocistage")
    group.addoption("--ocistage-require", action="store_true", default=False,
                    help="fail, not skip, a test whose component (docker-registry, skopeo, "
                         "runc, ...) is missing; the same as OCISTAGE_REQUIRE_E2E=1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs_root(why): the test needs root (why says for what); run as another "
        "user it is skipped with one reason, never failed, also under OCISTAGE_REQUIRE_E2E=1")
    if config.getoption("ocistage_require", default=False):
        config.stash[_SAVED_REQUIRE] = os.environ.get(REQUIRE_ENV)
        os.environ[REQUIRE_ENV] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``needs_root`` are skipped, before any fixture runs, when not root."""
    if running_as_root():
        return
    skip = pytest.mark.skip(reason=NEEDS_ROOT_REASON)
    for item in items:
        if item.get_closest_marker("needs_root") is not None:
            item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SAVED_REQUIRE in config.stash:
        saved = config.stash[_SAVED_REQUIRE]
        if saved is None:
            os.environ.pop(REQUIRE_ENV, None)
        else:
            os.environ[REQUIRE_ENV] = saved


# --- registries -------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def ocistage_session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for the session's registries, keys and certificates."""
    return tmp_path_factory.mktemp("ocistage")


@pytest.fixture(scope="session")
def oci_tls_material(ocistage_session_dir: Path) -> TlsMaterial:
    require_binary("openssl")
    return make_tls(ocistage_session_dir / "tls")


@pytest.fixture(scope="session")
def oci_signing_key(ocistage_session_dir: Path) -> SigningKey:
    require_binary("openssl")
    return make_signing_key(ocistage_session_dir / "token-key")


@pytest.fixture(scope="session")
def oci_registry(ocistage_session_dir: Path) -> Iterator[Registry]:
    """An anonymous plain-HTTP registry (loopback: ocistage talks HTTP to it by default)."""
    require_binary("docker-registry")
    with running_registry(ocistage_session_dir / "registry-plain") as registry:
        yield registry


@pytest.fixture(scope="session")
def oci_registry_tls(ocistage_session_dir: Path,
                     oci_tls_material: TlsMaterial) -> Iterator[Registry]:
    """An anonymous HTTPS registry; its CA is ``.ca_file`` (give it as ``--ca-file``)."""
    require_binary("docker-registry")
    with running_registry(ocistage_session_dir / "registry-tls",
                          tls=oci_tls_material) as registry:
        yield registry


@pytest.fixture(scope="session")
def oci_registry_basic_auth(ocistage_session_dir: Path) -> Iterator[Registry]:
    """A plain-HTTP registry with basic auth (``.username``/``.password``)."""
    require_binary("docker-registry")
    require_binary("htpasswd")
    with running_registry(ocistage_session_dir / "registry-basic", username=BASIC_USER,
                          password=BASIC_PASSWORD) as registry:
        yield registry


@pytest.fixture(scope="session")
def oci_token_issuer(oci_signing_key: SigningKey) -> Iterator[TokenIssuer]:
    """The token service of ``oci_registry_token`` (``.requests`` logs what it granted)."""
    with running_token_issuer(oci_signing_key, issuer=TOKEN_ISSUER, service=TOKEN_SERVICE,
                              users={TOKEN_USER: TOKEN_PASSWORD},
                              public=PUBLIC_REPOSITORIES) as issuer:
        yield issuer


@pytest.fixture(scope="session")
def oci_registry_token(ocistage_session_dir: Path, oci_token_issuer: TokenIssuer,
                       oci_signing_key: SigningKey) -> Iterator[Registry]:
    """A registry with bearer-token auth: anonymous pulls of ``public/...``, the rest with
    ``.username``/``.password``."""
    require_binary("docker-registry")
    auth = TokenAuth(realm=oci_token_issuer.realm, service=TOKEN_SERVICE, issuer=TOKEN_ISSUER,
                     rootcertbundle=oci_signing_key.cert)
    with running_registry(ocistage_session_dir / "registry-token", token=auth,
                          username=TOKEN_USER, password=TOKEN_PASSWORD) as registry:
        yield registry


@pytest.fixture
def oci_registry_factory(tmp_path: Path,
                         request: pytest.FixtureRequest) -> Iterator[Callable[..., Registry]]:
    """``factory(tls=False, username=None, password=None)``: a registry of this test alone."""
    with ExitStack() as stack:
        count = 0

        def start(tls: bool = False, username: str | None = None,
                  password: str | None = None) -> Registry:
            nonlocal count
            require_binary("docker-registry")
            if username is not None:
                require_binary("htpasswd")
            count += 1
            material = request.getfixturevalue("oci_tls_material") if tls else None
            return stack.enter_context(running_registry(
                tmp_path / f"registry-{count}", tls=material,
                username=username, password=password))

        yield start


@pytest.fixture
def fault_proxy(oci_registry: Registry) -> Iterator[FaultProxy]:
    """A fault-injecting proxy (plain HTTP) in front of ``oci_registry``."""
    with running_fault_proxy(oci_registry.url) as proxy:
        yield proxy


@pytest.fixture
def make_fault_proxy() -> Iterator[Callable[[Registry], FaultProxy]]:
    """A factory: a fault proxy (plain HTTP to the client) in front of any registry."""
    with ExitStack() as stack:
        yield lambda registry: stack.enter_context(
            running_fault_proxy(registry.url, registry.ca_file))


# --- images, the CLI, runtimes ----------------------------------------------------------------

class ImageFactory:
    """``oci_image(layers, **config)``: see :func:`~pytest_ocistage.imagebuild.build_image`.

    ``layers`` is one layer (a mapping or a directory) or a list of them; images go into one
    OCI layout per test, tagged ``image-1``, ``image-2``, ... unless ``tag`` is given.
    """

    def __init__(self, layout: Path) -> None:
        self.layout = layout
        self.built = 0

    def __call__(self, layers: LayerSource | Sequence[LayerSource], *, tag: str | None = None,
                 **config: Any) -> BuiltImage:
        self.built += 1
        sources = [layers] if isinstance(layers, (Path, Mapping)) else list(layers)
        return build_image(self.layout, sources, tag=tag or f"image-{self.built}", **config)


@pytest.fixture
def oci_image(tmp_path: Path) -> ImageFactory:
    return ImageFactory(tmp_path / "oci-layout")


@pytest.fixture
def ocistage_cache(tmp_path: Path) -> Path:
    """The cache directory the ``ocistage`` runner uses (made by the first command)."""
    return tmp_path / "ocistage-cache"


@pytest.fixture
def ocistage(tmp_path: Path, ocistage_cache: Path) -> OcistageRunner:
    """Runs ``ocistage`` in-process (``ocistage(*args)``) or as a process
    (``ocistage.run_process(*args)``) with a private cache, HOME and XDG directories."""
    return OcistageRunner.in_directory(tmp_path, cache=ocistage_cache)


@pytest.fixture
def run_bundle(tmp_path: Path) -> Callable[..., BundleRun]:
    """``run_bundle(bundle, runtime=None, timeout=120)``: run a bundle under rootless runc or
    crun (None: runc, or crun where runc cannot run it for this user, pytest_ocistage/
    bundles.py); returns its exit code, stdout and stderr, and the runtime that ran it."""
    def run(bundle: str | os.PathLike[str], runtime: str | None = None,
            timeout: float = 120) -> BundleRun:
        return run_bundle_in(Path(bundle), tmp_path / f"{runtime or 'runtime'}-state", runtime,
                             timeout)

    return run


# --- Slurm (pytest_ocistage/slurm.py) ---------------------------------------------------------

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


@pytest.fixture(scope="session")
def slurm_26_05() -> Iterator[SlurmCluster]:
    """Slurm 26.05.3 built by ``.ci/build-slurm.sh 26.05.3`` (with PMIx), as slurm_24_05:
    nodes n1-n3, node-local directories, scrun."""
    with session_cluster(built_spec("26.05"), ocistage_command()) as cluster:
        yield cluster


@pytest.fixture(params=["22.05", "24.05", "26.05"])
def slurm_cluster(request: pytest.FixtureRequest) -> SlurmCluster:
    """Each test cluster in turn: the test runs on 22.05, 24.05 and 26.05."""
    cluster: SlurmCluster = request.getfixturevalue("slurm_" + request.param.replace(".", "_"))
    return cluster


@pytest.fixture(params=["24.05", "26.05"])
def slurm_nodes(request: pytest.FixtureRequest) -> SlurmCluster:
    """Each three-node cluster in turn (the releases .ci/build-slurm.sh builds)."""
    cluster: SlurmCluster = request.getfixturevalue("slurm_" + request.param.replace(".", "_"))
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
