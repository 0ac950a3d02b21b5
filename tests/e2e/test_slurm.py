"""Bundles made and staged by ocistage run under real Slurm (srun/sbatch --container), on each
private test cluster in turn (``slurm_cluster``: Debian's 22.05 and the built 24.05.8).

The nodes' oci.conf is the one `ocistage runtime oci-conf --runtime runc` wrote
(pytest_ocistage/slurm.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ocistage.bundler.flows.bundle import make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.cache.leases import Holder, all_leases
from ocistage.cache.store import Store
from ocistage.stagers.directory import stage_directory
from ocistage.stagers.markers import hold
from ocistage.stagers.retired import retired_versions
from pytest_ocistage.components import require_binary
from pytest_ocistage.imagebuild import File, build_image, busybox_layer
from pytest_ocistage.images import OS_RELEASE_NAME, ImageRef
from pytest_ocistage.jobuser import JobUser
from pytest_ocistage.slurm import SlurmCluster, read_output
from tests.e2e.conftest import OcistageRunner

# the trust oracle's signed images, keys and lookaside (the submit admission test)
from tests.e2e.test_trust_oracle import REJECT, World, signed_by, world  # noqa: F401

pytestmark = pytest.mark.timeout(600)

PROBE = ('echo "uid=$(id -u) gid=$(id -g)"; echo "cwd=$(pwd)"; cat /etc/os-release; '
         'echo "greeting=$GREETING"; echo "fixture=$OCISTAGE_FIXTURE"; '
         'echo "job=$SLURM_JOB_ID"')


def _probe(output: str) -> dict[str, str]:
    values = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("uid", "cwd", "greeting", "fixture", "job", "NAME"):
            values[key] = value.strip('"')
    return values


def _staged_bundle(ocistage: OcistageRunner, ref: str, target: Path,
                   *bundle_options: str) -> Path:
    bundle = target / "bundle"
    ocistage("bundle", ref, str(bundle), *bundle_options, check=True)
    staged = stage_directory(bundle, target / "staged", cache_root=ocistage.cache,
                             name="image", holder=Holder.pin("test_slurm"))
    return Path(staged.path)


def _srun(slurm: SlurmCluster, *argv: str, user: JobUser | None = None,
          cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return slurm.srun(*argv, user=user, cwd=cwd, timeout=180)


# Slurm 24.05's slurmstepd resolves a relative command against the job's PATH on the host
# (task.c _build_path) before it starts the container: `srun --container=B sh` runs
# /usr/bin/sh, which the busybox image lacks. Direct srun calls name the command absolutely.
SH = "/bin/sh"


def test_srun_container_runs_a_staged_registry_image(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path) -> None:
    staged = _staged_bundle(ocistage, images["busybox"].ref, shared_dir)
    result = _srun(slurm_cluster, f"--container={staged}", SH, "-c", PROBE)
    assert result.returncode == 0, result.stderr
    values = _probe(result.stdout)
    assert values["uid"] == "1000 gid=1000"  # the image's User app, mapped to us
    assert values["cwd"] == "/home/app"
    assert values["NAME"] == OS_RELEASE_NAME
    assert values["greeting"] == "hello world"
    assert values["fixture"] == "busybox"
    assert values["job"].isdigit()


def test_sbatch_container_runs_and_scontrol_shows_the_container(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path) -> None:
    staged = _staged_bundle(ocistage, images["multilayer"].ref, shared_dir)
    output = shared_dir / "job.out"
    job_id = slurm_cluster.sbatch(f"--output={output}", f"--container={staged}", "--wrap",
                                  PROBE, cwd=shared_dir)
    record = slurm_cluster.wait_for_job(job_id)
    assert record["JobState"] == "COMPLETED", record
    assert record["Container"] == str(staged)
    values = _probe(read_output(output))
    assert values["uid"] == "1000 gid=1000"
    assert values["cwd"] == "/home/app"
    assert values["NAME"] == OS_RELEASE_NAME
    assert values["fixture"] == "multilayer"
    assert values["job"] == job_id


def test_a_restage_keeps_the_version_a_running_job_reads(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job runs a container on a staged bundle that it holds; the source changes and is
    staged again while it runs. The job goes on reading the version it started on (retired,
    not removed: removing it emptied the job's root filesystem under it), and the first stage
    after the job has ended removes that version."""
    slurm_cluster.export(monkeypatch)  # the stager asks squeue whether the job runs
    bundle = shared_dir / "bundle"
    ocistage("bundle", images["busybox"].ref, str(bundle), check=True)
    version = bundle / "rootfs" / "etc" / "version"
    version.write_text("one\n")
    to, cache = shared_dir / "staged", ocistage.cache
    first = stage_directory(bundle, to, cache_root=cache, name="app", holder=Holder.pin("t"))
    output = shared_dir / "job.out"
    job_id = slurm_cluster.sbatch(
        f"--output={output}", f"--container={first.path}", "--wrap",
        "cat /etc/version; sleep 8; cat /etc/version; ls /bin/sh", cwd=shared_dir)
    hold(cache, first.path, Holder.slurm_job(job_id))  # as `ocistage stage` in the job does
    deadline = time.monotonic() + 120
    while not (output.exists() and "one" in output.read_text()):
        assert time.monotonic() < deadline, slurm_cluster.job_record(job_id)
        time.sleep(0.2)
    replacement = version.with_name("version.new")  # a new inode, as an editor writes
    replacement.write_text("two\n")
    os.replace(replacement, version)
    second = stage_directory(bundle, to, cache_root=cache, name="app", holder=Holder.pin("t"))
    assert (second.path / "rootfs" / "etc" / "version").read_text() == "two\n"
    record = slurm_cluster.wait_for_job(job_id)
    # (slurmstepd may append its own complaints after the container's lines)
    assert read_output(output).splitlines()[:3] == ["one", "one", "/bin/sh"], \
        read_output(output)
    assert record["JobState"] == "COMPLETED", (record, read_output(output))
    [aside] = retired_versions(to, "app")
    slurm_cluster.wait_until_gone_from_squeue(job_id)
    third = stage_directory(bundle, to, cache_root=cache, name="app", holder=Holder.pin("t"))
    assert third.unchanged == third.files
    assert retired_versions(to, "app") == [] and not aside.exists()


def test_srun_container_runs_a_root_image(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path) -> None:
    umoci = require_binary("umoci")  # makes a root variant of the fixture image
    layout = shared_dir / "layout"
    shutil.copytree(images["busybox"].layout, layout, symlinks=True)
    subprocess.run([umoci, "config", "--image", f"{layout}:{images['busybox'].layout_tag}",
                    "--tag", "root", "--config.user", "0:0", "--config.workingdir", "/"],
                   check=True, capture_output=True, timeout=60)
    staged = _staged_bundle(ocistage, f"oci:{layout}:root", shared_dir)
    config = json.loads((staged / "config.json").read_text())
    assert config["process"]["user"]["uid"] == 0
    result = _srun(slurm_cluster, f"--container={staged}", SH, "-c",
                   PROBE + "; cat /proc/self/uid_map")
    assert result.returncode == 0, result.stderr
    values = _probe(result.stdout)
    assert values["uid"] == "0 gid=0"
    assert values["cwd"] == "/"
    assert values["NAME"] == OS_RELEASE_NAME
    assert result.stdout.split()[-3:] == ["0", str(os.getuid()), "1"]


def test_srun_container_as_an_unprivileged_user(
        slurm_cluster: SlurmCluster, slurm_job_user: JobUser, images: dict[str, ImageRef],
        shared_dir: Path) -> None:
    """A non-root job user: the bundle maps that user (runc 1.1 under Slurm needs map_root:
    it fchowns the step's stdio to the uid that container root maps to)."""
    store = Store.open(shared_dir / "cache")
    bundle = make_bundle(parse_reference(images["busybox"].ref), store, shared_dir / "bundle",
                         config_options=ConfigOptions(host_uid=slurm_job_user.uid,
                                                      host_gid=slurm_job_user.gid,
                                                      map_root=True)).path
    subprocess.run(["chown", "-R", f"{slurm_job_user.uid}:{slurm_job_user.gid}", str(bundle)],
                   check=True)
    result = _srun(slurm_cluster, f"--container={bundle}", SH, "-c",
                   PROBE + "; cat /proc/self/uid_map", user=slurm_job_user, cwd=shared_dir)
    assert result.returncode == 0, result.stderr
    values = _probe(result.stdout)
    assert values["uid"] == "0 gid=0"
    assert values["cwd"] == "/home/app"
    assert values["NAME"] == OS_RELEASE_NAME
    assert result.stdout.split()[-3:] == ["0", str(slurm_job_user.uid), "1"]


def test_submit_end_to_end_and_removal_after_the_job(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm_cluster.export(monkeypatch)  # dead_leases asks squeue in this process
    output = shared_dir / "submit.out"
    stage_to = shared_dir / "staged"
    result = ocistage("submit", images["busybox"].ref, "--stage-to", str(stage_to),
                      "--time=5", f"--output={output}", "--", "sh", "-c", PROBE,
                      env=slurm_cluster.env, check=True)
    job_id = result.stdout.strip()
    assert job_id.isdigit(), result.stdout
    record = slurm_cluster.wait_for_job(job_id)
    assert record["JobState"] == "COMPLETED", record
    staged = Path(record["Container"])
    assert staged.parent == stage_to
    values = _probe(read_output(output))
    assert values["uid"] == "1000 gid=1000"
    assert values["NAME"] == OS_RELEASE_NAME
    assert values["job"] == job_id
    assert not [lease for lease in all_leases(ocistage.cache) if lease.holder.kind == "pid"]
    # the job's afterany cleanup job releases its lease and removes the staged bundle; no
    # `cache gc` needed (tests/e2e/test_submit_cleanup.py: scancel, shared bundles, -N3)
    slurm_cluster.wait_until_gone_from_squeue(job_id)
    deadline = time.monotonic() + 60
    while staged.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not staged.exists()
    assert [lease for lease in all_leases(ocistage.cache)
            if lease.holder.kind == "slurm-job"] == []


def test_submit_srun_blocks_and_passes_the_exit_status(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path) -> None:
    """A bare command name (sh) runs the image's sh on 24.05 too, whose slurmstepd would look
    it up on the host (ocistage.runtimes.bundle_command)."""
    stage_to = shared_dir / "staged"
    # --srun: srun writes to the terminal it inherits, so the CLI runs as a process here
    result = ocistage.run_process("submit", images["busybox"].ref, "--srun", "--stage-to",
                                  str(stage_to), "--time=5", "--", "sh", "-c",
                                  PROBE + "; exit 3", env=slurm_cluster.env)
    assert result.returncode == 3, result.stderr
    values = _probe(result.stdout)
    assert values["NAME"] == OS_RELEASE_NAME
    assert values["uid"] == "1000 gid=1000"
    # the step is over: its staged bundle is removed, not left for a gc (issue 34)
    assert [p.name for p in stage_to.iterdir() if not p.name.startswith(".")] == []


def test_submit_srun_says_its_warnings_before_the_job_runs(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, shared_dir: Path,
        tmp_path: Path) -> None:
    """Issue 38: a warning of `submit --srun` came after the job's output on the terminal
    they share (it was printed with the result, once srun had returned). A group-shared cache
    gives a setuid image a warning as the bundle is made; it must precede what the job says."""
    layout = tmp_path / "layout"
    busybox = Path(shutil.which("busybox") or "/bin/busybox").resolve()
    build_image(layout, [busybox_layer(), {"bin/su": File(source=busybox, mode=0o4755)}],
                tag="t", cmd=["/bin/echo", "the job speaks"])
    cache = tmp_path / "group-cache"
    cache.mkdir()
    cache.chmod(0o2770)  # group-shared: setuid bits are taken, with a warning
    result = subprocess.run(
        [*ocistage.command, "submit", "--cache", str(cache), f"oci:{layout}:t", "--srun",
         "--stage-to", str(shared_dir / "staged"), "--time=5"],
        env=ocistage.environment(slurm_cluster.env), cwd=ocistage.cwd, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        timeout=300, check=False)
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    warning = next(n for n, line in enumerate(lines) if line.startswith("warning: 1 file(s)"))
    assert warning < lines.index("the job speaks"), lines


def test_submit_runs_the_image_command_without_one(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path) -> None:
    result = ocistage.run_process("submit", images["busybox"].ref, "--srun", "--stage-to",
                                  str(shared_dir / "staged"), "--time=5", env=slurm_cluster.env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hello from busybox"


def test_submit_runs_an_image_the_policy_admits_and_refuses_one_it_does_not(
        slurm_cluster: SlurmCluster, ocistage: OcistageRunner, world: World,  # noqa: F811
        shared_dir: Path, tmp_path: Path) -> None:
    """Image trust (docs/trust.md) on submit's pull: the signed image is staged and run by
    Slurm; the unsigned one is refused before anything is staged or srun starts."""
    repo = f"{world.registry.host}/{world.namespace}"
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"default": [REJECT], "transports": {"docker": {
        repo: [signed_by(world, keyPath=str(world.good_key))]}}}))
    trust = (f"--policy={policy}", f"--registries.d={world.registries_d}")
    stage_to = shared_dir / "trusted"
    refused = ocistage.run_process("submit", *trust, world.ref("unsigned:1"), "--srun",
                                   "--stage-to", str(stage_to), "--time=5", "--", "true",
                                   env=slurm_cluster.env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"error: {world.ref('unsigned:1')} is rejected by the policy {policy}" \
        in refused.stderr
    assert not stage_to.exists() or not any(stage_to.iterdir())
    admitted = ocistage.run_process("submit", *trust, world.ref("signed:1"), "--srun",
                                    "--stage-to", str(stage_to), "--time=5", "--", "sh", "-c",
                                    PROBE, env=slurm_cluster.env)
    assert admitted.returncode == 0, admitted.stdout + admitted.stderr
    assert _probe(admitted.stdout)["NAME"] == OS_RELEASE_NAME
