"""``srun --mpi=pmix -N3 --container=BUNDLE`` of an OpenMPI program on the 26.05 cluster (built
with PMIx, Debian's libpmix-dev): every rank runs on its node and talks to the others.

The image is made offline from Debian 12's packages as this host has them (the ``.deb`` files
in apt's cache: openmpi 4.1.4, libpmix2 4.2.2 and their libraries, unpacked with ``dpkg-deb
-x``), the program compiled here against them, and every library the program and the MCA/PMIx
plugins need (``ldd``) copied at its own path, with an ``ld.so.cache`` (``ldconfig -r``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ocistage.runtimes.oci_conf import lint_oci_conf
from ocistage.runtimes.slurm import SlurmVersion
from pytest_ocistage.components import component_unavailable, require_binary
from pytest_ocistage.imagebuild import build_image, busybox_layer
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner

pytestmark = pytest.mark.timeout(900)

APT_CACHE = Path("/var/cache/apt/archives")
#: Debian 12 packages of OpenMPI and what libopenmpi3 depends on outside the base system
PACKAGES = ("libopenmpi3", "libopenmpi-dev", "openmpi-common", "libpmix2", "libfabric1",
            "libucx0", "libibverbs1", "libpsm-infinipath1", "libpsm2-2", "librdmacm1",
            "libhwloc15", "libhwloc-plugins", "libevent-core-2.1-7",
            "libevent-pthreads-2.1-7", "libnl-3-200", "libnl-route-3-200", "libnuma1")
MULTIARCH = "usr/lib/x86_64-linux-gnu"
PROGRAM = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int rank, size, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    const char *node = getenv("SLURMD_NODENAME");
    printf("rank %d of %d on %s sum %d\n", rank, size, node ? node : "?", sum);
    MPI_Finalize();
    return 0;
}
"""


def _deb(package: str) -> Path:
    found = sorted(APT_CACHE.glob(f"{package}_*_amd64.deb")) + sorted(
        APT_CACHE.glob(f"{package}_*_all.deb"))
    if not found:
        component_unavailable(f"{package}: no .deb in {APT_CACHE} (apt-get download {package})")
    return found[-1]


def _unpack(root: Path) -> None:
    require_binary("dpkg-deb", "dpkg")
    for package in PACKAGES:
        if package in ("libnl-3-200", "libnl-route-3-200", "libnuma1") and not sorted(
                APT_CACHE.glob(f"{package}_*.deb")):
            continue  # installed on the host instead: copied by _copy_closure
        subprocess.run(["dpkg-deb", "-x", str(_deb(package)), str(root)], check=True,
                       timeout=120)


def _compile(root: Path, output: Path) -> None:
    gcc = require_binary("gcc", "gcc")
    lib = root / MULTIARCH
    source = output.with_suffix(".c")
    source.write_text(PROGRAM)
    subprocess.run([gcc, "-O1", "-o", str(output), str(source),
                    f"-I{lib}/openmpi/include", f"-I{lib}/openmpi/include/openmpi",
                    f"-L{lib}/openmpi/lib", "-lmpi", f"-Wl,-rpath-link,{lib}",
                    f"-Wl,-rpath-link,{lib}/openmpi/lib"], check=True, timeout=120)


def _copy_closure(root: Path, objects: list[Path]) -> None:
    """Every shared library ``objects`` need that ``root`` lacks, from the host, at its path
    (and the dynamic loader at /lib64)."""
    lib = root / MULTIARCH
    env = {"LD_LIBRARY_PATH": f"{lib}:{lib}/openmpi/lib:{lib}/pmix2/lib"}
    needed: set[str] = {"/lib64/ld-linux-x86-64.so.2"}
    for path in objects:
        result = subprocess.run(["ldd", str(path)], capture_output=True, text=True, env=env,
                                timeout=60, check=False)
        needed.update(re.findall(r"=> (/\S+) \(", result.stdout))
    for name in sorted(needed):
        if name.startswith(str(root)):
            continue
        target = root / MULTIARCH / Path(name).name
        if name.startswith("/lib64/"):
            target = root / name.lstrip("/")
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(name).resolve(), target)


def _mpi_root(work: Path) -> Path:
    root = work / "root"
    root.mkdir()
    _unpack(root)
    program = root / "opt/app/bin/mpihello"
    program.parent.mkdir(parents=True)
    _compile(root, program)
    objects = [program, *[p for p in root.rglob("*.so*") if p.is_file() and not p.is_symlink()]]
    _copy_closure(root, objects)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/ld.so.conf").write_text(f"/{MULTIARCH}\n/{MULTIARCH}/openmpi/lib\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True, timeout=120)
    for unused in ("usr/share/doc", "usr/share/man", "usr/share/lintian"):
        shutil.rmtree(root / unused, ignore_errors=True)
    return root


@pytest.fixture(scope="module")
def mpi_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The OpenMPI image's ``oci:`` reference (built once for the module)."""
    work = tmp_path_factory.mktemp("mpi-image")
    image = build_image(work / "layout", [busybox_layer(), _mpi_root(work)],
                        env={"PATH": "/opt/app/bin:/usr/bin:/bin"},
                        cmd=["/opt/app/bin/mpihello"])
    return image.ref


def test_srun_mpi_pmix_n3_container_runs_every_rank_on_its_node(
        slurm_26_05: SlurmCluster, ocistage: OcistageRunner, shared_dir: Path,
        mpi_image: str) -> None:
    bundle = shared_dir / "bundle"
    ocistage("bundle", mpi_image, str(bundle), check=True)
    # the step's spool directory (PMIx's sockets) at one path on every node, a directory of
    # its own per node (docs/slurm.md, "MPI"); the generated oci.conf plus that, as written
    conf = (slurm_26_05.oci_conf.read_text()
            + f'ContainerPath="{slurm_26_05.node_local}/oci"\n')
    assert lint_oci_conf(conf, SlurmVersion.parse(slurm_26_05.version)) == []
    with slurm_26_05.use_oci_conf(conf):
        result = slurm_26_05.srun("--mpi=pmix", "-N3", "-n3", "--time=2",
                                  f"--container={bundle}", "/opt/app/bin/mpihello",
                                  timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    assert lines == [f"rank {rank} of 3 on n{rank + 1} sum 3" for rank in range(3)], (
        result.stdout + result.stderr)

