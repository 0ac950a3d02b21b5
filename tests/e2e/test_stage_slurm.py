"""`ocistage stage --all-nodes` inside a real Slurm job (Debian's one-node 22.05 test cluster,
``slurm_22_05``): srun runs one stager per node, the staged bundle is leased by the job and runs
with `srun --container`. Skips when the cluster cannot be started (fails under
OCISTAGE_REQUIRE_E2E=1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ocistage.cache.leases import all_leases, dead_leases
from pytest_ocistage.images import ImageRef
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner

pytestmark = pytest.mark.timeout(600)


def test_stage_all_nodes_inside_a_job(slurm_22_05: SlurmCluster, ocistage: OcistageRunner,
                                      images: dict[str, ImageRef], shared_dir: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    slurm_22_05.export(monkeypatch)  # dead_leases asks squeue in this process
    bundle = Path(json.loads(ocistage("bundle", images["busybox"].ref, "--json",
                                      check=True).stdout)["path"])
    target = shared_dir / "staged"
    script = shared_dir / "job.sh"
    command = " ".join(f"'{part}'" for part in ocistage.command)
    script.write_text(
        "#!/bin/sh\nset -e\n"
        f"{command} stage --all-nodes '{bundle}' --to '{target}' --json > '{shared_dir}/out.json'\n"
        f"srun --overlap --container=\"$(sed -n 's/.*\"path\": \"\\(.*\\)\".*/\\1/p' "
        f"'{shared_dir}/out.json' | head -n1)\" true\n"
        "echo job=$SLURM_JOB_ID\n")
    script.chmod(0o755)
    result = slurm_22_05.srun("-N1", str(script), env=ocistage.environment(), cwd=shared_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = result.stdout.strip().rsplit("job=", 1)[-1]
    assert job_id.isdigit(), result.stdout
    per_node = json.loads((shared_dir / "out.json").read_text())
    assert len(per_node) == 1
    staged = Path(per_node[0]["path"])
    assert staged.parent == target and (staged / "rootfs").is_dir()
    assert per_node[0]["method"] == "hardlink"
    job_leases = [lease for lease in all_leases(ocistage.cache)
                  if lease.target == f"staged:{staged}"]
    assert [(lease.holder.kind, lease.holder.job_id) for lease in job_leases] == [
        ("slurm-job", job_id)]
    assert json.loads((staged / ".ocistage-staged.json").read_text())["id"] == \
        job_leases[0].id
    slurm_22_05.wait_until_gone_from_squeue(job_id)
    assert [lease.id for lease in dead_leases(ocistage.cache)] == [job_leases[0].id]
    ocistage("unstage", str(staged), env=slurm_22_05.env, check=True)
    assert not staged.exists()
    assert all_leases(ocistage.cache) == []
