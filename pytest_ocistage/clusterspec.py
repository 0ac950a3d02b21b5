"""Describes which Slurm a private test cluster runs (Debian's 22.05, the releases
.ci/build-slurm.sh builds) and says whether this host can start it."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

SLURM_24_05_SHA256 = "b1b1549ee80fbcd2e4a3b40f17b0e794f92893b6e059d32d964d8db92c399b0e"
SLURM_24_05_PREFIX = Path("/opt/ocistage-slurm") / SLURM_24_05_SHA256[:16]
SLURM_26_05_SHA256 = "b7c7c7c8d78f7fde485ac7fc811034c5dd1a067d0167dba1a044e731c0374b13"
SLURM_26_05_PREFIX = Path("/opt/ocistage-slurm") / SLURM_26_05_SHA256[:16]
#: the releases built by .ci/build-slurm.sh: release -> (version, prefix, variable naming
#: another prefix)
BUILT_RELEASES = {
    "24.05": ("24.05.8", SLURM_24_05_PREFIX, "OCISTAGE_SLURM_PREFIX"),
    "26.05": ("26.05.3", SLURM_26_05_PREFIX, "OCISTAGE_SLURM_26_05_PREFIX"),
}
DEBIAN_SLURM = Path("/usr")
HYBRID_CGROUP2 = "/sys/fs/cgroup/unified"


class ClusterError(RuntimeError):
    """A test cluster could not be started."""


@dataclass(frozen=True)
class ClusterSpec:
    """What to start: which Slurm installation, how many nodes."""

    name: str                 # ClusterName, and part of the directory name
    prefix: Path              # the installation: PREFIX/bin/srun, PREFIX/sbin/slurmctld
    node_count: int = 1       # 1: one node named after the host; more: n1..nN
    oci_runtime: str = "runc"
    #: on a hybrid cgroup host, unmount the cgroup2 hierarchy in the nodes' mount namespaces
    #: (crun 1.8 refuses hybrid layouts whose cgroup2 part has controllers enabled)
    legacy_cgroups: bool = False
    #: the cluster's plugstack.conf (SPANK plugins, e.g. pyxis's line); empty by default
    plugstack: str = ""
    #: directories put first on the daemons' PATH (pyxis runs enroot from slurmd's PATH)
    daemon_path: tuple[str, ...] = ()
    #: give each slurmd's mount namespace a /dev/fuse of mode 0666 (a device node of its own
    #: bind-mounted over the host's, which is 0600 on some hosts): FUSE for job users
    #: (squashfuse, fuse-overlayfs) without changing the host
    user_fuse: bool = False
    #: the text of ``/etc/ocistage/config.toml`` (ocistage's site config) as the nodes see it:
    #: each slurmd's mount namespace gets an overlay of /etc holding it, so a site setting
    #: (``policy_mandatory``) binds the jobs without the host's /etc being written; "": none
    site_config: str = ""

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "bin"

    @property
    def sbin_dir(self) -> Path:
        return self.prefix / "sbin"


def debian_spec() -> ClusterSpec:
    return ClusterSpec(name="ocistage2205", prefix=DEBIAN_SLURM, node_count=1)


def built_spec(release: str = "24.05") -> ClusterSpec:
    """A three-node cluster of a release .ci/build-slurm.sh builds (24.05 or 26.05)."""
    _version, default, variable = BUILT_RELEASES[release]
    prefix = Path(os.environ.get(variable, str(default)))
    return ClusterSpec(name="ocistage" + release.replace(".", ""), prefix=prefix, node_count=3,
                       legacy_cgroups=True)


def check_spec(spec: ClusterSpec) -> str | None:
    """Why spec cannot be started here, or None."""
    if os.getuid() != 0:
        return "starting a Slurm cluster needs root (slurmd runs jobs as their users)"
    for binary in ("munged", "munge", "unshare", "runuser"):
        if shutil.which(binary) is None:
            return f"{binary} not found on PATH (Debian: munge, util-linux)"
    for path in (spec.sbin_dir / "slurmctld", spec.sbin_dir / "slurmd", spec.bin_dir / "srun"):
        if not os.access(path, os.X_OK):
            if spec.prefix == DEBIAN_SLURM:
                return f"{path} is missing (Debian: apt-get install slurm-wlm slurm-client)"
            built = {str(prefix): (version, variable)
                     for version, prefix, variable in BUILT_RELEASES.values()}
            version, variable = built.get(str(spec.prefix), ("24.05.8", "OCISTAGE_SLURM_PREFIX"))
            return (f"{path} is missing: build Slurm {version} with `.ci/build-slurm.sh "
                    f"{version}` (as .ci/run does; set {variable} for another prefix)")
    return None


def hybrid_cgroup2() -> bool:
    """Whether this host mounts cgroup v1 controllers plus a cgroup2 hierarchy (hybrid)."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    for line in mounts:
        fields = line.split()
        if len(fields) > 4 and fields[4] == HYBRID_CGROUP2:
            return " - cgroup2 " in line
    return False
