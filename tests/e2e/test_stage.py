"""`ocistage stage` / `unstage` end to end: fixture images from the real registry are bundled,
staged by every method, and the staged bundles run under rootless runc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.cache import leases
from ocistage.cache.bundleinfo import SHARED_ROOT_ANNOTATION
from ocistage.cache.treeremoval import remove_tree
from ocistage.stagers.filemanifest import MARKER_NAME
from pytest_ocistage.bundles import BundleRun, run_bundle
from pytest_ocistage.components import require_binary
from pytest_ocistage.images import ImageRef
from pytest_ocistage.slurm import SlurmCluster
from tests.e2e.conftest import OcistageRunner
from tests.e2e.terminal import run_on_terminal
from tests.procs import descendants_named, running
from tests.stagers.conftest import require_fuse_mount

GREETING = "hello from busybox"


def stage(ocistage: OcistageRunner, *args: str) -> dict[str, object]:
    result = ocistage("stage", *args, "--json", check=True)
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


@pytest.fixture
def shm() -> Iterator[Path]:
    """A node-local target on another filesystem than the cache (tmpfs)."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("/dev/shm is not writable here")
    path = Path("/dev/shm") / f"ocistage-e2e-{uuid.uuid4().hex[:10]}"
    path.mkdir()
    yield path
    remove_tree(path)


@pytest.mark.parametrize("mode", ["hardlink", "pool", "copy"])
def test_staged_bundle_runs_under_runc(images: dict[str, ImageRef], ocistage: OcistageRunner,
                                       tmp_path: Path, shm: Path, mode: str) -> None:
    target = shm if mode == "pool" else tmp_path / "target"
    extra = ["--copy"] if mode == "copy" else []
    doc = stage(ocistage, images["busybox"].ref, "--to", str(target), *extra)
    assert doc["method"] == mode
    staged = Path(str(doc["path"]))
    assert staged.parent == target
    config = json.loads((staged / "config.json").read_text())
    if mode == "copy":
        # the cache bundle is read-only only because it shares files with the cache's
        # snapshot; an independent copy of it is writable again, otherwise the same config
        bundle = Path(str(json.loads(ocistage("bundle", images["busybox"].ref, "--json",
                                              check=True).stdout)["path"]))
        original = json.loads((bundle / "config.json").read_text())
        assert original["root"]["readonly"] is True
        assert original["annotations"].pop(SHARED_ROOT_ANNOTATION) == "true"
        original["root"]["readonly"] = False
        assert config == original
    else:  # shared inodes: the container must not write through them
        assert config["root"]["readonly"] is True
    result = run_bundle(staged, tmp_path / "runc")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == GREETING
    again = stage(ocistage, images["busybox"].ref, "--to", str(target), *extra)
    assert again["path"] == doc["path"]
    assert again["unchanged"] == again["files"] and again["copied"] == 0
    lease_id = str(doc["lease_id"])
    assert [lease.id for lease in leases.leases_on(ocistage.cache, f"staged:{staged}")] \
        == [lease_id]
    removed = ocistage("unstage", str(staged), "--json", check=True)
    assert json.loads(removed.stdout)["removed"] is True
    assert not os.path.lexists(staged)
    assert leases.leases_on(ocistage.cache, f"staged:{staged}") == []


def test_multilayer_image_stages_and_unstages_completely(
        images: dict[str, ImageRef], ocistage: OcistageRunner, shm: Path) -> None:
    """Setuid files, a FIFO, a mode-000 file, a read-only dir and an escaping symlink."""
    doc = stage(ocistage, images["multilayer"].ref, "--to", str(shm))
    staged = Path(str(doc["path"]))
    bundle = Path(str(json.loads(ocistage("bundle", images["multilayer"].ref, "--json",
                                          check=True).stdout)["path"]))
    names = sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*"))
    staged_names = sorted(str(p.relative_to(staged)) for p in staged.rglob("*")
                          if p.name not in (MARKER_NAME, ".ocistage-manifest.json"))
    assert staged_names == names
    ocistage("unstage", str(staged), check=True)
    assert sorted(os.listdir(shm)) == [".ocistage-pool"]  # the empty scratch dir went
    assert [p for p in (shm / ".ocistage-pool").rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("mount", ["--mount", "--unpack"])
def test_squashfs_staged_bundle_runs(images: dict[str, ImageRef], ocistage: OcistageRunner,
                                     tmp_path: Path, mount: str) -> None:
    require_binary("mksquashfs")
    require_binary("unsquashfs")
    if mount == "--mount":
        require_fuse_mount()  # a user needs a /dev/fuse open to them (0600 here: root's)
    target = tmp_path / "target"
    doc = stage(ocistage, images["busybox"].ref, "--to", str(target), "--format", "squashfs",
                mount)
    staged = Path(str(doc["path"]))
    try:
        assert doc["method"] == ("squashfs-mount" if mount == "--mount" else "squashfs-unpack")
        assert os.path.ismount(staged) is (mount == "--mount")
        result = run_bundle(staged, tmp_path / "runc")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == GREETING
    finally:
        ocistage("unstage", str(staged), check=True)
    assert not os.path.lexists(staged)
    assert not (target / f"{staged.name}.sqfs").exists()


def test_a_restaged_squashfs_mount_stays_readable_to_a_running_container(
        images: dict[str, ImageRef], ocistage: OcistageRunner, tmp_path: Path) -> None:
    """A mounted squashfs bundle is re-staged while a container runs on it: its mount is busy,
    so it is detached lazily (it used to fail "cannot unmount"); the container goes on
    reading the image it started with, and NAME mounts the new one."""
    require_fuse_mount()
    bundle = tmp_path / "bundle"
    ocistage("bundle", images["busybox"].ref, str(bundle), check=True)
    version = bundle / "rootfs" / "etc" / "version"
    version.write_text("one\n")
    # the container says when it has read /etc/version once and waits to be told to read it
    # again, through a directory of the test's bind-mounted at /signal
    signal_dir = tmp_path / "signal"
    signal_dir.mkdir()
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["args"] = [
        "/bin/sh", "-c",
        "cat /etc/version; touch /signal/read; n=0; "
        "while [ ! -e /signal/again ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done; "
        "cat /etc/version; ls /bin/sh"]
    config["mounts"].append({"destination": "/signal", "type": "bind",
                             "source": str(signal_dir), "options": ["rbind", "rw"]})
    (bundle / "config.json").write_text(json.dumps(config))
    target = tmp_path / "target"
    staged = Path(str(stage(ocistage, str(bundle), "--to", str(target), "--format", "squashfs",
                            "--mount")["path"]))
    try:
        runs: list[BundleRun] = []
        runner = threading.Thread(
            target=lambda: runs.append(run_bundle(staged, tmp_path / "runc")))
        runner.start()
        deadline = time.monotonic() + 60
        while not (signal_dir / "read").exists():  # it has read /etc/version once
            assert runner.is_alive(), runs
            assert time.monotonic() < deadline, "the container never read /etc/version"
            time.sleep(0.05)
        replacement = version.with_name("version.new")
        replacement.write_text("two\n")
        os.replace(replacement, version)
        again = stage(ocistage, str(bundle), "--to", str(target), "--format", "squashfs",
                      "--mount")
        assert again["method"] == "squashfs-mount"
        assert runner.is_alive()  # still running on the image it started with
        (signal_dir / "again").touch()
        runner.join(timeout=120)
        [run] = runs
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == ["one", "one", "/bin/sh"]
        assert (staged / "rootfs" / "etc" / "version").read_text() == "two\n"
    finally:
        ocistage("unstage", str(staged), check=True)
    assert not os.path.lexists(staged)


def test_squashfs_image_through_a_file_url_runs(images: dict[str, ImageRef],
                                                ocistage: OcistageRunner,
                                                tmp_path: Path) -> None:
    require_binary("mksquashfs")
    require_binary("unsquashfs")
    url = f"file://{tmp_path / 'store'}"
    pushed = ocistage("stage", images["busybox"].ref, "--to", url, "--format", "squashfs",
                      "--name", "busybox", check=True)
    assert pushed.stdout.strip() == f"{url}/busybox.sqfs"
    doc = stage(ocistage, f"{url}/busybox.sqfs", "--to", str(tmp_path / "node"), "--unpack")
    staged = Path(str(doc["path"]))
    assert staged == tmp_path / "node" / "busybox"
    result = run_bundle(staged, tmp_path / "runc")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == GREETING
    ocistage("unstage", str(staged), check=True)


def test_any_directory_tree_can_be_staged(ocistage: OcistageRunner, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "file").write_text("data\n")
    out = ocistage("stage", str(tree), "--to", str(tmp_path / "t"), "--name", "x", check=True)
    staged = Path(out.stdout.strip())
    assert (staged / "a" / "b" / "file").read_text() == "data\n"
    bad = ocistage("unstage", str(tree))
    assert bad.returncode == 1 and "not staged by ocistage" in bad.stderr
    assert (tree / "a" / "b" / "file").exists()
    assert ocistage("unstage", str(staged)).returncode == 0


def _staged_by_dead_job(ocistage: OcistageRunner, *args: str) -> Path:
    """Stage inside a Slurm job that squeue does not know (it ended long ago)."""
    result = ocistage("stage", *args, "--json", env={"SLURM_JOB_ID": "987654321"}, check=True)
    return Path(str(json.loads(result.stdout)["path"]))


def test_cache_gc_unmounts_and_removes_a_squashfs_mount_of_an_ended_job(
        images: dict[str, ImageRef], ocistage: OcistageRunner, tmp_path: Path,
        slurm_22_05: SlurmCluster) -> None:
    """gc asks the test cluster's squeue, which no longer knows the job."""
    require_fuse_mount()
    target = tmp_path / "target"
    staged = _staged_by_dead_job(ocistage, images["busybox"].ref, "--to", str(target),
                                 "--format", "squashfs", "--mount")
    kept = stage(ocistage, images["busybox"].ref, "--to", str(target), "--name", "kept",
                 "--format", "squashfs", "--mount", "--pin", "mine")
    try:
        assert os.path.ismount(staged)
        ocistage("cache", "gc", env=slurm_22_05.env, check=True)
        assert not os.path.lexists(staged) and not os.path.ismount(staged)
        assert not (target / f"{staged.name}.sqfs").exists()
        assert leases.leases_on(ocistage.cache, f"staged:{staged}") == []
        assert os.path.ismount(str(kept["path"]))  # a live pin keeps its mount
        assert ocistage("unstage", str(kept["path"])).returncode == 0
    finally:
        for path in (staged, Path(str(kept["path"]))):
            if os.path.ismount(path):
                subprocess.run(["umount", str(path)], check=False)
    assert sorted(os.listdir(target)) == []


def test_cache_gc_removes_a_pool_bundle_of_an_ended_job_and_sweeps_its_pool(
        images: dict[str, ImageRef], ocistage: OcistageRunner, shm: Path,
        tmp_path: Path, slurm_22_05: SlurmCluster) -> None:
    """gc asks the test cluster's squeue, which no longer knows the job."""
    dead = _staged_by_dead_job(ocistage, images["multilayer"].ref, "--to", str(shm))
    live = Path(str(stage(ocistage, images["busybox"].ref, "--to", str(shm),
                          "--pin", "mine")["path"]))
    (shm / "user-file").write_text("not ocistage's\n")
    pool = shm / ".ocistage-pool"
    live_files = {p.stat().st_ino for p in live.rglob("*") if p.is_file()
                  and not p.is_symlink()}
    before = {p for p in pool.rglob("*") if p.is_file()}
    ocistage("cache", "gc", env=slurm_22_05.env, check=True)
    assert not dead.exists()
    after = {p for p in pool.rglob("*") if p.is_file()}
    assert after < before  # what only the ended job's bundle used is gone ...
    assert all(p.stat().st_nlink > 1 for p in after)  # ... and every entry left is in use
    assert {p.stat().st_ino for p in after} <= live_files
    assert (shm / "user-file").read_text() == "not ocistage's\n"
    assert sorted(os.listdir(shm)) == [".ocistage-pool", live.name, "user-file"]
    result = run_bundle(live, tmp_path / "runc")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == GREETING


def test_a_path_is_a_path_and_a_bare_name_goes_to_no_registry(
        ocistage: OcistageRunner, tmp_path: Path) -> None:
    """14.4: paths said `invalid registry '.'` / `invalid repository name`, and a bare name
    went to Docker Hub; 14.6: a file as --to said `check that the source is readable`;
    28.5: each is a usage error (exit 2), as `bundle ./nothere` is."""
    target = tmp_path / "t"
    for what in ("./mybundel", "/nonexistent/dir", "mybundel"):
        result = ocistage("stage", what, "--to", str(target))
        assert result.returncode == 2, result.stderr
        assert f"error: no such directory: {what}" in result.stderr
    tree = tmp_path / "tree"
    (tree / "rootfs").mkdir(parents=True)
    afile = tmp_path / "afile"
    afile.write_text("x")
    result = ocistage("stage", str(tree), "--to", str(afile))
    assert result.returncode == 2 and f"the target {afile} is not a directory" in result.stderr
    assert "source is readable" not in result.stderr


#: the keys of `ocistage stage --json` on one node (docs/staging.md, "JSON output")
STAGE_KEYS = {"path", "source", "node", "method", "files", "copied", "linked", "unchanged",
              "bytes_copied", "lease_id"}


def test_stage_json_is_snake_case_and_squashfs_reports_the_tree(
        ocistage: OcistageRunner, tmp_path: Path) -> None:
    """14.9: stage said bytesCopied/leaseId, and squashfs the compressed image's size."""
    require_binary("mksquashfs")
    require_binary("unsquashfs")
    tree = tmp_path / "tree"
    (tree / "rootfs").mkdir(parents=True)
    for n in range(20):
        (tree / "rootfs" / f"f{n}").write_bytes(b"compressible " * (1000 + n))
    size = sum(p.stat().st_size for p in (tree / "rootfs").iterdir())
    copied = stage(ocistage, str(tree), "--to", str(tmp_path / "a"), "--copy")
    image = stage(ocistage, str(tree), "--to", str(tmp_path / "b"), "--format", "squashfs",
                  "--unpack")
    for doc in (copied, image):
        assert set(doc) == STAGE_KEYS
    assert copied["bytes_copied"] == image["bytes_copied"] == size
    assert image["files"] == copied["files"] == 20
    for doc in (copied, image):
        removed = ocistage("unstage", str(doc["path"]), "--json", check=True)
        assert json.loads(removed.stdout) == {"path": doc["path"], "removed": True}


def test_squashfs_staging_shows_progress_on_a_terminal(ocistage: OcistageRunner,
                                                       tmp_path: Path) -> None:
    """14.9: `--format squashfs` showed nothing while mksquashfs ran."""
    require_binary("mksquashfs")
    require_binary("unsquashfs")
    tree = tmp_path / "tree"
    (tree / "rootfs").mkdir(parents=True)
    (tree / "rootfs" / "f").write_bytes(b"x" * 100000)
    code, shown = run_on_terminal(
        [*ocistage.command, "stage", str(tree), "--to", str(tmp_path / "t"), "--format",
         "squashfs", "--unpack"], ocistage.environment({"TERM": "xterm"}), ocistage.cwd)
    assert code == 0, shown
    assert b"building squashfs image" in shown


def _default_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [15, 1], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_a_stage_and_its_mksquashfs_like_ctrl_c(
        ocistage: OcistageRunner, tmp_path: Path, signum: int) -> None:
    """A workflow tool's terminate() or a closed terminal (issue 27.6): the stage stops with
    its mksquashfs, leaves no scratch behind, and the immediate re-run succeeds."""
    require_binary("mksquashfs")
    tree = tmp_path / "tree"
    for n in range(20):
        (tree / f"d{n}").mkdir(parents=True)
        for m in range(4):
            (tree / f"d{n}" / f"f{m}").write_bytes(os.urandom(1 << 20))  # incompressible
    target = tmp_path / "target"
    argv = [*ocistage.command, "stage", str(tree), "--to", str(target), "--name", "x",
            "--format", "squashfs", "--unpack"]
    # SIGHUP as a closed terminal sends it: the stage must not inherit an ignored SIGHUP from
    # a suite run under nohup (ocistage keeps an ignored SIGHUP ignored, by design)
    process = subprocess.Popen(argv, cwd=ocistage.cwd, env=ocistage.environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_default_sighup)
    try:
        deadline = time.monotonic() + 120
        while not (children := descendants_named(process.pid, "mksquashfs")):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "mksquashfs never started"
            time.sleep(0.02)
        os.kill(process.pid, signum)
        _out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    deadline = time.monotonic() + 10  # mksquashfs ends with the stage, not long after it
    while left := [pid for pid in children if running(pid)]:
        assert time.monotonic() < deadline, f"mksquashfs {left} still runs 10 s after the stage"
        time.sleep(0.02)
    leftovers = [p.name for p in target.iterdir()] if target.exists() else []
    assert [name for name in leftovers if not name.startswith(".ocistage")] == [], leftovers
    again = ocistage("stage", str(tree), "--to", str(target), "--name", "x",
                     "--format", "squashfs", "--unpack", check=True)
    assert (Path(again.stdout.strip()) / "d3" / "f1").stat().st_size == 1 << 20
