"""``ocistage doctor``'s checks (bundler/doctor/), each with fake inputs: the text of a file,
a command's output, a ``stat`` result."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ocistage.bundler.doctor.namespaces import check_runtime_dir, check_subuid, check_userns
from ocistage.bundler.doctor.places import check_cache, check_stage_target, judge_stage_dir
from ocistage.bundler.doctor.registry import check_registry, registry_to_check
from ocistage.bundler.doctor.report import Check, DoctorReport, Status
from ocistage.bundler.doctor.runtimes import check_crun, check_runc, parse_version
from ocistage.bundler.doctor.settings import check_ca_file, check_config
from ocistage.bundler.doctor.slurm import (
    check_oci_conf,
    check_oci_conf_location,
    check_slurm,
    slurm_conf_location,
)
from ocistage.bundler.doctor.squashfs import (
    FuseFacts,
    check_fuse,
    check_mksquashfs,
    check_squashfuse,
)
from ocistage.bundler.registry.errors import AuthenticationError, RegistryUnreachable
from ocistage.errors import UsageError
from ocistage.runtimes.slurm import SlurmVersion
from tests.bundler.test_pyxis import MKSQUASHFS_HELP

USER = 1000


def _stat(mode: int, uid: int = USER, gid: int = USER) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, gid, 0, 0, 0, 0))


# -- runtimes ----------------------------------------------------------------------------------

RUNC_1_1 = "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\n"
RUNC_1_2 = "runc version 1.2.4\ncommit: v1.2.4-0-g6c52b3fc\nspec: 1.2.0\n"
CRUN = "crun version 1.8.1\ncommit: f8a096be\nrundir: /run/crun\nspec: 1.0.0\n+SYSTEMD +SECCOMP\n"


def test_versions_are_read_from_what_the_runtimes_print() -> None:
    assert parse_version(RUNC_1_1) == (1, 1, 5)
    assert parse_version(CRUN) == (1, 8, 1)
    assert parse_version("runc version 1.2") == (1, 2)
    assert parse_version("nonsense") is None
    assert parse_version(None) is None


def test_runc_1_1_is_a_warning_for_users_only() -> None:
    user = check_runc(RUNC_1_1, USER, crun_found=True)
    assert user.status is Status.WARN and "1.1.5" in user.detail
    assert user.fix is not None and "--map-root" in user.fix
    assert check_runc(RUNC_1_1, 0, crun_found=True).status is Status.OK
    assert check_runc(RUNC_1_2, USER, crun_found=False) == Check("runc", Status.OK, "runc 1.2.4")
    assert check_runc("runc: weird build", USER, crun_found=True).status is Status.WARN


def test_crun_warns_on_a_hybrid_cgroup_host() -> None:
    assert check_crun(CRUN, True, None).status is Status.OK  # no cgroup2 hierarchy there
    assert check_crun(CRUN, True, "\n").status is Status.OK  # hybrid, but no controllers
    hybrid = check_crun(CRUN, True, "hugetlb\n")
    assert hybrid.status is Status.WARN and "hugetlb" in hybrid.detail
    assert hybrid.fix is not None and "runc" in hybrid.fix


def test_no_runtime_at_all_is_missing_one_of_two_is_not() -> None:
    assert check_runc(None, USER, crun_found=True).status is Status.WARN
    assert check_crun(None, True, None).status is Status.WARN
    none = check_runc(None, USER, crun_found=False)
    assert none.status is Status.MISSING and not none.core
    assert check_crun(None, False, None).status is Status.MISSING


# -- user namespaces, subuid, XDG_RUNTIME_DIR ----------------------------------------------


@pytest.mark.parametrize(("clone", "max_ns", "apparmor", "uid", "status"), [
    (None, "96365\n", None, USER, Status.OK),         # an upstream kernel
    ("1\n", "15000\n", None, USER, Status.OK),        # Debian, allowed
    ("0\n", "15000\n", None, USER, Status.MISSING),   # Debian, refused to users
    ("0\n", "15000\n", None, 0, Status.OK),           # ... not to root
    (None, "0\n", None, 0, Status.MISSING),           # none at all
    (None, "15000\n", "1\n", USER, Status.WARN),      # Ubuntu 24.04's AppArmor rule
    (None, "15000\n", "0\n", USER, Status.OK),
])
def test_user_namespaces(clone: str | None, max_ns: str | None, apparmor: str | None, uid: int,
                         status: Status) -> None:
    check = check_userns(clone, max_ns, apparmor, uid)
    assert check.status is status, check
    assert (check.fix is None) == (status is Status.OK)


def test_subuid_ranges_from_the_files(tmp_path: Path) -> None:
    (tmp_path / "subuid").write_text("other:100000:65536\nalice:165536:65536\n")
    (tmp_path / "subgid").write_text("alice:165536:65536\n")
    good = check_subuid(tmp_path, USER, "alice", newuidmap=True)
    assert good.status is Status.OK and "165536" in good.detail
    assert check_subuid(tmp_path, USER, "alice", newuidmap=False).fix == "apt install uidmap"
    bob = check_subuid(tmp_path, 1001, "bob", newuidmap=True)
    assert bob.status is Status.WARN and "usermod --add-subuids" in (bob.fix or "")
    (tmp_path / "subgid").write_text("")
    assert "subgid" in check_subuid(tmp_path, USER, "alice", newuidmap=True).detail
    (tmp_path / "subgid").write_text(f"{USER}:200000:10\n")  # by uid, as shadow allows
    assert check_subuid(tmp_path, USER, "alice", newuidmap=True).status is Status.OK
    assert check_subuid(tmp_path / "none", 0, "root", newuidmap=False).status is Status.OK


def test_xdg_runtime_dir() -> None:
    assert check_runtime_dir(None, 0, None).status is Status.OK
    unset = check_runtime_dir(None, USER, None)
    assert unset.status is Status.WARN and "--root" in (unset.fix or "")
    private = _stat(stat.S_IFDIR | 0o700)
    assert check_runtime_dir("/run/user/1000", USER, private).status is Status.OK
    for bad in (_stat(stat.S_IFDIR | 0o755), _stat(stat.S_IFDIR | 0o700, uid=0),
                _stat(stat.S_IFREG | 0o600), None):
        assert check_runtime_dir("/run/user/1000", USER, bad).status is Status.WARN, bad


# -- FUSE and squashfs tools ----------------------------------------------------------------

FUSE = _stat(stat.S_IFCHR | 0o666, uid=0)


@pytest.mark.parametrize(("facts", "uid", "status", "said"), [
    (FuseFacts(FUSE, True, True, "user_allow_other\n"), USER, Status.OK, "usable"),
    (FuseFacts(None, False, True, None), USER, Status.WARN, "no /dev/fuse"),
    (FuseFacts(_stat(stat.S_IFCHR | 0o600, uid=0), False, True, None), USER, Status.WARN,
     "crw------- root"),
    (FuseFacts(FUSE, True, False, "user_allow_other"), USER, Status.WARN, "fusermount"),
    (FuseFacts(FUSE, True, True, "# user_allow_other\n"), USER, Status.WARN,
     "user_allow_other"),
    (FuseFacts(FUSE, True, False, None), 0, Status.OK, "usable"),  # root needs neither
])
def test_fuse(facts: FuseFacts, uid: int, status: Status, said: str) -> None:
    check = check_fuse(facts, uid)
    assert check.status is status and said in check.detail, check


def test_squashfuse() -> None:
    assert check_squashfuse("/usr/bin/squashfuse", "/usr/bin/squashfuse_ll").detail == (
        "/usr/bin/squashfuse, /usr/bin/squashfuse_ll")
    alone = check_squashfuse(None, "/usr/bin/squashfuse_ll")
    assert alone.status is Status.MISSING and "squashfuse_ll alone" in alone.detail
    assert not alone.core


# an older mksquashfs (4.3) does not know -help: its error is the usage, compressors included
MKSQUASHFS_4_3_ERROR = """mksquashfs: invalid option

SYNTAX:mksquashfs source1 source2 ...  dest [options] [-e list of exclude dirs/files]

Filesystem build options:
-comp <comp>\t\tselect <comp> compression
\t\t\tCompressors available:
\t\t\t\tgzip (default)
\t\t\t\tlzo
\t\t\t\tlz4
\t\t\t\txz
\t\t\t\tzstd
-b <block_size>\t\tset data block to <block_size>.  Default 128 Kbytes
"""


def test_mksquashfs_and_its_compressors() -> None:
    assert check_mksquashfs(None, None, None).status is Status.MISSING
    older = check_mksquashfs("/usr/bin/mksquashfs", MKSQUASHFS_4_3_ERROR, "/usr/bin/unsquashfs")
    assert older == Check("mksquashfs", Status.OK, "compressors gzip, lzo, lz4, xz, zstd")
    no_zstd = check_mksquashfs("/usr/bin/mksquashfs", MKSQUASHFS_HELP, "/usr/bin/unsquashfs")
    assert no_zstd.status is Status.WARN and "no zstd" in no_zstd.detail
    assert check_mksquashfs("/m", "no list here", "/u").status is Status.WARN
    assert check_mksquashfs("/m", MKSQUASHFS_4_3_ERROR, None).status is Status.WARN


# -- settings, cache, stage target ------------------------------------------------------------


def test_cache_ownership_space_and_creation(tmp_path: Path) -> None:
    me = os.geteuid()
    mine = _stat(stat.S_IFDIR | 0o700, uid=me)
    assert check_cache(tmp_path, mine, True, 100 << 30).status is Status.OK
    low = check_cache(tmp_path, mine, True, 1 << 20)
    assert low.status is Status.WARN and "1.0 MiB free" in low.detail
    foreign = check_cache(tmp_path, _stat(stat.S_IFDIR | 0o755, uid=me + 4242), True, None)
    assert foreign.status is Status.MISSING and foreign.core and "owned by" in foreign.detail
    world = check_cache(tmp_path, _stat(stat.S_IFDIR | 0o777, uid=me), True, None)
    assert world.status is Status.MISSING and "writable by every user" in world.detail
    assert check_cache(tmp_path, mine, False, None).status is Status.MISSING
    later = check_cache(tmp_path / "c", None, True, 100 << 30, tmp_path)
    assert later.status is Status.OK and "made on first use" in later.detail
    assert check_cache(tmp_path / "c", None, False, None, tmp_path).status is Status.MISSING


def test_stage_target_none_url_and_directories(tmp_path: Path) -> None:
    none = check_stage_target(None, "default", judge_stage_dir)
    assert none.status is Status.WARN and "--to" in (none.fix or "")
    url = check_stage_target("ssh://node/x", "option --to", judge_stage_dir)
    assert url.status is Status.OK
    made_later = check_stage_target(str(tmp_path / "a" / "b"), "option --to", judge_stage_dir)
    assert made_later.status is Status.OK and f"made on first use in {tmp_path}" in \
        made_later.detail
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)  # writable by others, not sticky: refused as stage does
    refused = judge_stage_dir(open_to_all / "x")
    assert refused.status is Status.MISSING and refused.core
    assert "writable by every user" in refused.detail
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert judge_stage_dir(a_file).status is Status.MISSING


def test_config_check() -> None:
    from ocistage.bundler.settings import Settings
    from ocistage.cache.notice import Kind, Notice

    broken = check_config(None, UsageError("config file /x: `jobs` must be ...", "fix it"))
    assert broken == Check("config", Status.MISSING, "config file /x: `jobs` must be ...",
                           "fix it", core=True)
    plain = Settings(cache=Path("/c"), origins={"cache": "default"})
    assert check_config(plain, None).detail == "no config file"
    warned = Settings(cache=Path("/c"), origins={"jobs": "file /etc/ocistage/config.toml"},
                      warnings=(Notice(Kind.CONFIG, "unknown key `jobz`"),))
    check = check_config(warned, None)
    assert check.status is Status.WARN and "/etc/ocistage/config.toml" in check.detail


def test_ca_file_check(tmp_path: Path) -> None:
    from tests.bundler.fakeregistry import self_signed_cert

    assert check_ca_file(None, "default") is None
    cert = self_signed_cert(tmp_path)[0]
    good = check_ca_file(cert, "option --ca-file")
    assert good is not None and good.status is Status.OK and "1 CA certificate" in good.detail
    bad = check_ca_file(str(tmp_path / "none.pem"), "environment OCISTAGE_CA_FILE")
    assert bad is not None and bad.status is Status.MISSING and bad.core
    assert "(environment OCISTAGE_CA_FILE)" in bad.detail


# -- Slurm and oci.conf -------------------------------------------------------------------------


def test_slurm_and_oci_conf(tmp_path: Path) -> None:
    from ocistage.runtimes.oci_conf import lint_oci_conf_file

    assert check_slurm(None, "scontrol not found on PATH").status is Status.MISSING
    version = SlurmVersion(22, 5, 8)
    assert check_slurm(version, None).detail == "Slurm 22.05.8 (scontrol --version)"
    path = tmp_path / "oci.conf"
    assert check_oci_conf(path, None, version).status is Status.WARN
    path.write_text('RunTimeRun="runc --rootless=true run %n.%u.%j.%s.%t -b %b"\n'
                    'RunTimeQuery="runc state %n.%u.%j.%s.%t"\nSrunPath=/usr/bin/srun\n')
    problems = [str(p) for p in lint_oci_conf_file(path, version)]
    linted = check_oci_conf(path, problems, version)
    assert linted.status is Status.WARN and "more)" in linted.detail
    assert f"oci-conf --check {path}" in (linted.fix or "")
    assert check_oci_conf(path, [], version).status is Status.OK


#: what ``scontrol show config`` prints (24.05, abridged)
SHOW_CONFIG = """Configuration data as of 2026-11-28T15:00:00
AccountingStorageBackupHost = (null)
SLURM_CONF              = /opt/slurm/etc/slurm.conf
SLURM_VERSION           = 24.05.8
"""


def test_the_slurm_conf_is_what_slurm_says_never_a_guess(tmp_path: Path) -> None:
    """Issue 38: with SLURM_CONF unset, doctor checked /etc/slurm/oci.conf (another cluster's,
    beside a prefix-built Slurm): it asks scontrol, and says so when nobody tells."""
    assert slurm_conf_location({"SLURM_CONF": "/a/slurm.conf"}, SHOW_CONFIG) == (
        Path("/a/slurm.conf"), "$SLURM_CONF")
    assert slurm_conf_location({}, SHOW_CONFIG) == (
        Path("/opt/slurm/etc/slurm.conf"), "scontrol show config")
    down = "slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)\n"
    conf, how = slurm_conf_location({}, down)
    assert conf is None and "Unable to contact" in how
    unknown = check_oci_conf_location(conf, how)
    assert unknown is not None and unknown.status is Status.WARN
    assert "SLURM_CONF" in (unknown.fix or "") and "/etc/slurm" not in unknown.detail
    assert slurm_conf_location({}, None)[0] is None
    configless = check_oci_conf_location(tmp_path / "absent" / "slurm.conf", "scontrol")
    assert configless is not None and "configless" in configless.detail
    (tmp_path / "etc").mkdir()
    assert check_oci_conf_location(tmp_path / "etc" / "slurm.conf", "scontrol") is None


# -- a registry --------------------------------------------------------------------------------


def test_registry_check_from_what_the_ping_raises() -> None:
    def answers() -> None:
        return None

    def asks() -> None:
        raise AuthenticationError("r:5000 requires authentication")

    def down() -> None:
        raise RegistryUnreachable("cannot connect to r:5000: connection refused")

    assert check_registry("r:5000", answers).status is Status.OK
    assert check_registry("r:5000", asks).status is Status.WARN
    failed = check_registry("r:5000", down)
    assert failed.status is Status.MISSING and failed.core and "refused" in failed.detail
    assert failed.fix == RegistryUnreachable.default_hint


def test_registry_to_check() -> None:
    assert registry_to_check(None, None) is None
    assert registry_to_check(None, "r:5000") == "r:5000"
    assert registry_to_check("r:5000/team/app:1", None) == "r:5000"
    assert registry_to_check("alpine", None) == "docker.io"
    with pytest.raises(UsageError, match="not both"):
        registry_to_check("alpine", "r:5000")
    with pytest.raises(UsageError, match="local source"):
        registry_to_check("oci:/some/layout:tag", None)


# -- the report --------------------------------------------------------------------------------


def test_the_report_fails_on_a_missing_core_check_only() -> None:
    optional = Check("fuse", Status.MISSING, "no /dev/fuse", "modprobe fuse")
    core = Check("cache", Status.MISSING, "/c is owned by x", "use --cache", core=True)
    fine = DoctorReport("alice", USER, (Check("runc", Status.OK, "runc 1.2.4"), optional))
    assert fine.ok and fine.to_json()["ok"] is True
    assert fine.to_json()["checks"][1] == {"name": "fuse", "status": "missing",
                                           "detail": "no /dev/fuse", "fix": "modprobe fuse",
                                           "core": False}
    assert not DoctorReport("alice", USER, (core, optional)).ok


# -- hostile tools on PATH: doctor runs whatever is found there --------------------------------


def _tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _doctor_json(tmp_path: Path, bin_dir: Path) -> tuple[dict[str, object], int]:
    """``ocistage doctor --json`` with only ``bin_dir`` on PATH, run from a small Python
    that reports its children's peak RSS (KiB): doctor's, or a tool's doctor waited for."""
    import json
    import subprocess
    import sys

    wrapper = ("import json, resource, subprocess, sys\n"
               "done = subprocess.run(sys.argv[1:], capture_output=True, timeout=300)\n"
               "print(json.dumps([done.returncode, done.stdout.decode(errors='replace'),"
               " done.stderr.decode(errors='replace'),"
               " resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "OCISTAGE_CACHE": str(tmp_path / "c"),
           "OCISTAGE_CONFIG": str(tmp_path / "none.toml"), "NO_COLOR": "1",
           "XDG_CONFIG_HOME": str(tmp_path / ".config")}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    done = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "ocistage",
                           "doctor", "--json"], capture_output=True, text=True, timeout=360,
                          env=env, cwd=tmp_path, check=True)
    code, out, err, peak_kib = json.loads(done.stdout)
    assert "internal error" not in err and "Traceback" not in err, err
    assert code in (0, 1), err
    return json.loads(out), peak_kib


def test_tools_printing_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "runc", r"printf 'runc version 1.2.4\377\n\376'")
    _tool(bin_dir, "crun", r"printf '\377\376\n' >&2; exit 1")
    _tool(bin_dir, "mksquashfs", r"printf '\377 zstd\n'")
    _tool(bin_dir, "scontrol", r"printf 'slurm \377\n'")
    report, _ = _doctor_json(tmp_path, bin_dir)
    checks = {c["name"]: c for c in report["checks"]}  # type: ignore[attr-defined]
    assert checks["runc"]["status"] == "ok" and "runc 1.2.4" in checks["runc"]["detail"]
    assert checks["crun"]["status"] == "warn"  # printed no version
    assert checks["slurm"]["status"] == "missing"
    assert "not a Slurm version" in checks["slurm"]["detail"]


def test_a_tool_printing_200_mb_is_read_bounded(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # head and tr stay small themselves: the memory would be doctor's
    _tool(bin_dir, "runc", "/usr/bin/head -c 200000000 /dev/zero | /usr/bin/tr '\\0' x")
    _tool(bin_dir, "scontrol", "exec /usr/bin/yes 'slurm 22.05.8'")  # never ends
    report, peak_kib = _doctor_json(tmp_path, bin_dir)
    checks = {c["name"]: c for c in report["checks"]}  # type: ignore[attr-defined]
    assert checks["runc"]["status"] == "warn"  # 64 KiB of x: no version
    # killed at 64 KiB: a version that never ends is no answer
    assert checks["slurm"]["status"] == "missing"
    assert "scontrol --version failed" in checks["slurm"]["detail"]
    assert peak_kib < 150 * 1024, f"peak RSS {peak_kib} KiB"
