"""Bundles on the three-node Slurm test clusters, 24.05.8 and 26.05.3 (``slurm_nodes``, issue 12):

- ``srun -N3 --container=BUNDLE`` of bundles made by ``ocistage bundle``: the fixture image
  (``User app``), a root variant (``User 0:0``) and a numeric one (``User 1000:1000``), run on
  every node, as root and as an unprivileged job user;
- every ``ocistage runtime oci-conf`` template whose runtime is installed here (runc, crun)
  runs a three-node job;
- a site pull-through cache (Debian's docker-registry with ``proxy: remoteurl:``) given as
  ``--mirror``: after one pull through it the origin is stopped and all three nodes still stage
  the image into their node-local directories;
- the cluster itself: each node sees only its own node-local directory.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from ocistage.bundler.flows.bundle import make_bundle
from ocistage.bundler.image.reference import parse_reference
from ocistage.bundler.runtime_config import ConfigOptions
from ocistage.cache.store import Store
from ocistage.runtimes.oci_conf import RUNTIMES
from pytest_ocistage.components import Registry, http_status, require_binary, running_registry
from pytest_ocistage.images import OS_RELEASE_NAME, FixtureLayouts, ImageRef, PushSpec, push
from pytest_ocistage.jobuser import JobUser
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner

pytestmark = pytest.mark.timeout(600)

PROBE = ('echo "node=$SLURMD_NODENAME uid=$(id -u) gid=$(id -g) cwd=$(pwd) '
         'map=$(cat /proc/self/uid_map | tr -s " " | sed "s/^ //")"; grep ^NAME= /etc/os-release')


@pytest.fixture(scope="module")
def user_variants(images: dict[str, ImageRef],
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """oci: references of the busybox fixture with ``User`` set to 0:0 and to 1000:1000."""
    umoci = require_binary("umoci")  # makes user variants of the fixture image
    base = images["busybox"]
    layout = tmp_path_factory.mktemp("user-variants") / "layout"
    shutil.copytree(base.layout, layout, symlinks=True)
    refs = {}
    for tag, user, workdir in (("root", "0:0", "/"), ("numeric", "1000:1000", "/home/app")):
        subprocess.run([umoci, "config", "--image", f"{layout}:{base.layout_tag}", "--tag", tag,
                        "--config.user", user, "--config.workingdir", workdir],
                       check=True, capture_output=True, timeout=60)
        refs[tag] = f"oci:{layout}:{tag}"
    refs["named"] = base.ref
    return refs


def _lines(output: str) -> dict[str, dict[str, str]]:
    """The probe's ``node=... uid=...`` lines, by node."""
    by_node: dict[str, dict[str, str]] = {}
    for line in output.splitlines():
        if line.startswith("node="):
            head, _, mapping = line.partition(" map=")
            fields = dict(part.split("=", 1) for part in head.split())
            fields["map"] = mapping
            by_node[fields["node"]] = fields
    return by_node


@pytest.mark.parametrize(("variant", "uid", "cwd"), [
    ("named", "1000", "/home/app"),     # User app, resolved from the image's /etc/passwd
    ("numeric", "1000", "/home/app"),   # User 1000:1000
    ("root", "0", "/"),                 # User 0:0
])
def test_srun_n3_container_runs_a_bundle_on_every_node(
        slurm_nodes: SlurmCluster, ocistage: OcistageRunner, user_variants: dict[str, str],
        shared_dir: Path, variant: str, uid: str, cwd: str) -> None:
    bundle = shared_dir / "bundle"
    ocistage("bundle", user_variants[variant], str(bundle), check=True)
    config = json.loads((bundle / "config.json").read_text())
    assert str(config["process"]["user"]["uid"]) == uid
    result = slurm_nodes.srun("-N3", "--ntasks-per-node=1", f"--container={bundle}",
                              "/bin/sh", "-c", PROBE, cwd=shared_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    by_node = _lines(result.stdout)
    assert sorted(by_node) == ["n1", "n2", "n3"], result.stdout
    for fields in by_node.values():
        assert (fields["uid"], fields["gid"], fields["cwd"]) == (uid, uid, cwd), fields
        # the container user is the caller (root) on the host, whatever the image says
        assert f"{uid} {os.getuid()} 1" in fields["map"], fields
    assert result.stdout.count(f'NAME="{OS_RELEASE_NAME}"') == 3


def test_srun_n3_container_as_an_unprivileged_user(
        slurm_nodes: SlurmCluster, slurm_job_user: JobUser, images: dict[str, ImageRef],
        shared_dir: Path) -> None:
    """A bundle mapping the job user (map_root, as runc 1.1 under Slurm needs) runs on every
    node for that user."""
    user = slurm_job_user
    store = Store.open(shared_dir / "cache")
    bundle = make_bundle(parse_reference(images["busybox"].ref), store, shared_dir / "bundle",
                         config_options=ConfigOptions(host_uid=user.uid, host_gid=user.gid,
                                                      map_root=True)).path
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(bundle)], check=True)
    result = slurm_nodes.srun("-N3", "--ntasks-per-node=1", f"--container={bundle}",
                              "/bin/sh", "-c", PROBE, user=user, cwd=shared_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    by_node = _lines(result.stdout)
    assert sorted(by_node) == ["n1", "n2", "n3"], result.stdout
    for fields in by_node.values():
        assert (fields["uid"], fields["cwd"]) == ("0", "/home/app"), fields
        assert f"0 {user.uid} 1" in fields["map"], fields


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_installed_runtimes_oci_conf_runs_a_job(
        slurm_nodes: SlurmCluster, ocistage: OcistageRunner, images: dict[str, ImageRef],
        shared_dir: Path, runtime: str) -> None:
    """The template of each runtime (run mode: create/start is refused, docs/slurm.md)."""
    if shutil.which(runtime) is None:
        pytest.skip(f"{runtime} is not installed here (not packaged in Debian 12)")
    bundle = shared_dir / "bundle"
    ocistage("bundle", images["busybox"].ref, str(bundle), check=True)
    text = ocistage("runtime", "oci-conf", "--runtime", runtime,  # state: the spool dir
                    env=slurm_nodes.env, check=True).stdout
    conf = shared_dir / "oci.conf"
    conf.write_text(text)
    ocistage("runtime", "oci-conf", "--check", str(conf), env=slurm_nodes.env, check=True)
    with slurm_nodes.use_oci_conf(text):
        result = slurm_nodes.srun("-N3", "--ntasks-per-node=1", f"--container={bundle}",
                                  "/bin/sh", "-c", PROBE, cwd=shared_dir)
    assert result.returncode == 0, f"{text}\n{result.stdout}{result.stderr}"
    assert sorted(_lines(result.stdout)) == ["n1", "n2", "n3"], result.stdout


def test_each_node_sees_only_its_own_node_local_directory(slurm_nodes: SlurmCluster) -> None:
    local = slurm_nodes.node_local
    result = slurm_nodes.srun(
        "-N3", "--ntasks-per-node=1", "/bin/sh", "-c",
        f'echo "$SLURMD_NODENAME" > {local}/mine && ls {local}; '
        f'grep -c " {local} " /proc/self/mountinfo')
    assert result.returncode == 0, result.stderr
    for node in slurm_nodes.nodes:
        assert (slurm_nodes.node_dir(node) / "mine").read_text() == f"{node}\n"
        (slurm_nodes.node_dir(node) / "mine").unlink()
    assert result.stdout.split().count("mine") == 3  # each node listed only its own file
    assert not any(local.iterdir())  # the host's own view stays empty


def test_a_pull_through_cache_serves_every_node_after_the_origin_stopped(
        slurm_nodes: SlurmCluster, ocistage: OcistageRunner,
        fixture_layouts_built: FixtureLayouts, tmp_path: Path) -> None:
    """A site mirror (docker-registry in proxy mode in front of the origin) given as --mirror:
    once an image went through it, the origin is stopped and each of the three nodes, with an
    empty node-local cache, still stages it."""
    require_binary("docker-registry")
    with ExitStack() as stack:
        origin_stack = stack.enter_context(ExitStack())
        origin = origin_stack.enter_context(running_registry(tmp_path / "origin"))
        (tmp_path / "push").mkdir()
        image = push(PushSpec("site", "busybox", origin, "site/busybox"), fixture_layouts_built,
                     tmp_path / "push")
        mirror = stack.enter_context(running_registry(tmp_path / "mirror",
                                                      proxy_remote=origin.url))
        mirror_option = f"--mirror={origin.host}={mirror.url}"
        ocistage("pull", image.ref, mirror_option, check=True)  # warms the site cache
        warm = _blob_gets(mirror, image.layer_digests[0])
        assert warm == 1
        # the proxy streams a blob to its client while it stores it; stopping the origin before
        # the store finished loses the blob ("Error committing to storage: ... EOF"), so wait
        _wait_until_stored(mirror, "site/busybox",
                           [image.config_digest or "", *image.layer_digests])
        origin_stack.close()
        with pytest.raises(OSError):
            http_status(f"{origin.url}/v2/", None)

        local = slurm_nodes.node_local
        command = " ".join(shlex.quote(part) for part in ocistage.command)
        script = (f"OCISTAGE_CACHE={local}/cache exec {command} stage {image.ref} "
                  f"{mirror_option} --to {local}/staged --name image")
        result = slurm_nodes.srun("-N3", "--ntasks-per-node=1", "/bin/sh", "-c", script,
                                  env=ocistage.environment(), cwd=tmp_path)
        try:
            assert result.returncode == 0, result.stdout + result.stderr
            for node in slurm_nodes.nodes:
                staged = slurm_nodes.node_dir(node) / "staged" / "image"
                assert (staged / "rootfs" / "bin" / "busybox").is_file(), node
                config = json.loads((staged / "config.json").read_text())
                assert config["process"]["user"]["uid"] == 1000
            # every node fetched the layer itself, from the mirror (the origin is down)
            assert _blob_gets(mirror, image.layer_digests[0]) == warm + 3
        finally:
            for node in slurm_nodes.nodes:
                for name in ("staged", "cache"):
                    shutil.rmtree(slurm_nodes.node_dir(node) / name, ignore_errors=True)


def _wait_until_stored(registry: Registry, repository: str, digests: list[str],
                       timeout: float = 60) -> None:
    """Until a registry's filesystem storage holds every blob: its ``data`` and the
    repository's link to it, the two things the registry's commit writes, in that order."""
    v2 = registry.storage / "docker" / "registry" / "v2"
    paths = []
    for digest in filter(None, digests):
        hex_digest = digest.removeprefix("sha256:")
        paths += [v2 / "blobs" / "sha256" / hex_digest[:2] / hex_digest / "data",
                  v2 / "repositories" / repository / "_layers" / "sha256" / hex_digest / "link"]
    deadline = time.monotonic() + timeout
    while missing := [path for path in paths if not path.is_file()]:
        assert time.monotonic() < deadline, (
            f"the mirror did not store {[str(p.relative_to(v2)) for p in missing]} in "
            f"{timeout:.0f} s: {registry.log_file.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)


def _blob_gets(registry: Registry, digest: str) -> int:
    """Successful GETs of a blob in the registry's access log."""
    log = registry.log_file.read_text(errors="replace")
    return len(re.findall(rf'"GET /v2/[^ ]*/blobs/{re.escape(digest)} HTTP/[0-9.]+" 200 ', log))
