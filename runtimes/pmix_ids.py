"""Whether an MPI rank in a bundle can authenticate to Slurm's PMIx server (``--mpi=pmix``).

slurmstepd's PMIx server registers each rank with the job user's uid and gid. A client reaches
it over ``ptl/tcp`` (``PMIX_SERVER_URI*=...;tcp4://127.0.0.1:PORT``), and PMIx's ``native``
security then checks the uid/gid the *client reports* (its ``geteuid()``/``getegid()``, i.e. as
seen inside the container's user namespace) against the registered ones (openpmix
``psec_native.c`` ``validate_cred``, ``PMIX_PROTOCOL_V2``). A rootless bundle that maps the
job user to another id inside (``--map-root``: container root; an image ``USER``) makes every
rank report that id: the server answers ``PMIX_ERR_INVALID_CRED`` by closing the connection
and OpenMPI stops in ``MPI_Init`` (``OPAL ERROR: Unreachable in file ext3x_client.c at line
112``; verified on 26.05.3 with PMIx 4.2.2, tests/e2e/test_slurm_mpi_user.py). Root's jobs pass
(0 is 0). The ranks must run as the host uid/gid itself: an identity mapping, which runc 1.1
refuses (it needs container uid 0 mapped) and crun (or runc >= 1.2) runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ocistage.cache.notice import Kind, Notice

HINT = ("run the ranks as your own uid/gid inside the container (an identity user-namespace "
        "mapping, no --map-root) with crun or runc >= 1.2")


def _host_id(mappings: Any, container_id: int) -> int | None:
    if not isinstance(mappings, list):
        return None
    for entry in mappings:
        if not isinstance(entry, Mapping):
            continue
        start, host, size = (entry.get("containerID"), entry.get("hostID"), entry.get("size"))
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, host, size)):
            continue
        assert isinstance(start, int) and isinstance(host, int) and isinstance(size, int)
        if start <= container_id < start + size:
            return host + container_id - start
    return None


def pmix_credential_problem(config: Mapping[str, Any]) -> str | None:
    """Why PMIx's server would refuse this bundle's ranks (their uid or gid inside differs from
    the host id it maps to), or None (no user namespace, or an identity mapping)."""
    linux = config.get("linux")
    process = config.get("process")
    if not isinstance(linux, Mapping) or not isinstance(process, Mapping):
        return None
    namespaces = linux.get("namespaces")
    if not isinstance(namespaces, list) or not any(
            isinstance(ns, Mapping) and ns.get("type") == "user" for ns in namespaces):
        return None
    user = process.get("user")
    if not isinstance(user, Mapping):
        return None
    for kind, key in (("uid", "uidMappings"), ("gid", "gidMappings")):
        inside = user.get(kind, 0)
        if not isinstance(inside, int):
            continue
        host = _host_id(linux.get(key), inside)
        if host is not None and host != inside:
            return (f"the process runs as {kind} {inside} inside the container, host {kind} "
                    f"{host}: Slurm's PMIx server (srun --mpi=pmix) refuses its ranks, which "
                    f"report {inside} (MPI_Init: 'OPAL ERROR: Unreachable')")
    return None


def asks_for_pmix(options: Sequence[str]) -> bool:
    """Whether sbatch/srun ``options`` ask for ``--mpi=pmix`` (any pmix version)."""
    for index, option in enumerate(options):
        value = None
        if option.startswith("--mpi="):
            value = option[len("--mpi="):]
        elif option == "--mpi" and index + 1 < len(options):
            value = options[index + 1]
        if value is not None and value.startswith("pmix"):
            return True
    return False


def mpi_notices(config: Mapping[str, Any], options: Sequence[str]) -> tuple[Notice, ...]:
    """A warning for ``submit ... --mpi=pmix`` when the bundle's ranks would be refused by
    Slurm's PMIx server (:func:`pmix_credential_problem`), before the job meets it."""
    if not asks_for_pmix(options):
        return ()
    problem = pmix_credential_problem(config)
    if problem is None:
        return ()
    return (Notice(Kind.RUNTIME, f"{problem}; {HINT} (`ocistage bundle --map-self`)"),)
