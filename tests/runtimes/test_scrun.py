"""scrun stage hooks: config rewriting, the Lua template run by a real Lua 5.3 with a stub
``slurm`` table (tests/runtimes/scrun_harness.lua), stage-in/out through the real stagers."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ocistage.cache.leases import all_leases
from ocistage.errors import UsageError
from ocistage.runtimes.engines import (
    CONMON_PATH,
    docker_daemon_json,
    podman_containers_conf,
)
from ocistage.runtimes.errors import ScrunError
from ocistage.runtimes.scrun import MARKER, StageInRequest, stage_in, stage_out
from ocistage.runtimes.scrun_config import merge_env, rewrite_config
from ocistage.runtimes.scrun_lua import (
    ScrunLuaOptions,
    hook_ocistage,
    lua_string,
    render_scrun_lua,
    scrun_lua_options,
)
from ocistage.runtimes.scrun_stagedir import private_dir
from pytest_ocistage.components import require_binary, running_as_root
from tests.cotenant import require_python_for
from tests.runtimes.scrun_bundle import ENGINE_FILE, make_engine_bundle, minimal_runtime_config

HARNESS = Path(__file__).with_name("scrun_harness.lua")
OCISTAGE = (sys.executable, "-c", "from ocistage.bundler.cli.app import main; main()")


def _rootfs(path: Path) -> Path:
    (path / "etc").mkdir(parents=True)
    (path / "etc" / "os-release").write_text('NAME="scrun test"\n')
    (path / "bin").mkdir()
    (path / "bin" / "tool").write_bytes(b"#!/bin/sh\necho tool\n" * 100)
    (path / "bin" / "tool").chmod(0o755)
    (path / "bin" / "link").symlink_to("tool")
    (path / "data").mkdir()
    for n in range(5):
        (path / "data" / f"f{n}").write_text(f"file {n}\n")
    return path


# -- pure parts --------------------------------------------------------------------------------


def test_lua_string_escapes_everything_that_could_end_the_literal() -> None:
    assert lua_string("plain/path-1") == '"plain/path-1"'
    assert lua_string('a"b\\c\nd]]') == '"a\\034b\\092c\\010d]]"'
    assert lua_string("é") == '"\\195\\169"'


def test_render_refuses_bad_options() -> None:
    with pytest.raises(UsageError):
        render_scrun_lua(ScrunLuaOptions(stage_dir="relative"))
    with pytest.raises(UsageError):
        render_scrun_lua(ScrunLuaOptions(stage_to="elsewhere"))  # type: ignore[arg-type]
    text = render_scrun_lua(ScrunLuaOptions(ocistage=("/opt/o s/ocistage",),
                                            stage_to="node-local", stage_dir="/scratch/x",
                                            cache="/c"))
    assert 'local OCISTAGE = {"/opt/o s/ocistage"}' in text
    assert 'local STAGE_TO = "node-local"' in text
    assert 'local CACHE = "/c"' in text
    assert "function slurm_scrun_stage_in(id, bundle, spool_dir, config_file, job_id" in text
    assert "function slurm_scrun_stage_out(id, bundle, orig_bundle, root_path" in text


def test_merge_env_container_first_job_fills_in_and_slurm_always_from_the_job() -> None:
    merged = merge_env(["PATH=/c/bin", "A=1", "SLURM_JOB_ID=stale"],
                       ["PATH=/job/bin", "B=2", "SLURM_JOB_ID=42", "bad name=x", "A=9"])
    assert merged == ["PATH=/c/bin", "A=1", "SLURM_JOB_ID=42", "B=2"]


def test_rewrite_config_for_root_job_user(tmp_path: Path) -> None:
    config = make_engine_bundle(tmp_path, _rootfs(tmp_path / "src"), minimal_runtime_config())
    base = json.loads((config[0] / "config.json").read_text())
    new, dropped = rewrite_config(base, root_path=tmp_path / "staged", uid=0, gid=0,
                                  job_env=["SLURM_JOB_ID=7", "FROM_JOB=1"])
    assert new["root"]["path"] == str(tmp_path / "staged")
    assert new["process"]["user"] == {"uid": 1000, "gid": 1000}
    assert new["linux"]["uidMappings"] == [{"containerID": 1000, "hostID": 0, "size": 1},
                                           {"containerID": 0, "hostID": 65534, "size": 1}]
    assert [ns["type"] for ns in new["linux"]["namespaces"]] == ["pid", "mount", "user"]
    for key in ("cgroupsPath", "resources"):
        assert key not in new["linux"]
    assert "prestart" not in new["hooks"]
    assert [m["destination"] for m in new["mounts"]] == ["/proc"]
    assert new["process"]["env"] == ["PATH=/usr/bin:/bin", "IMAGE=yes", "SLURM_JOB_ID=7",
                                     "FROM_JOB=1"]
    assert f"mount /etc/resolv.conf (source {ENGINE_FILE} missing)" in dropped
    assert "hooks.prestart" in dropped and "linux.cgroupsPath" in dropped
    assert base["linux"]["cgroupsPath"] == "/docker/abc"  # the input is not modified


def test_rewrite_config_for_unprivileged_job_user_runs_as_container_root() -> None:
    new, dropped = rewrite_config(minimal_runtime_config(), root_path=Path("/s"), uid=1234,
                                  gid=99, job_env=[])
    assert new["process"]["user"] == {"uid": 0, "gid": 0}
    assert new["linux"]["uidMappings"] == [{"containerID": 0, "hostID": 1234, "size": 1}]
    assert new["linux"]["gidMappings"] == [{"containerID": 0, "hostID": 99, "size": 1}]
    assert any(d.startswith("process.user 1000:1000") for d in dropped)


def test_private_dir_refuses_a_directory_someone_else_made(tmp_path: Path) -> None:
    assert private_dir(tmp_path / "s" / "1") == tmp_path / "s" / "1"
    assert (tmp_path / "s" / "1").stat().st_mode & 0o777 == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    with pytest.raises(ScrunError, match="not a private directory"):
        private_dir(loose)
    (tmp_path / "link").symlink_to(tmp_path / "s" / "1")
    with pytest.raises(ScrunError):
        private_dir(tmp_path / "link")
    if os.getuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        with pytest.raises(ScrunError):
            private_dir(foreign)


def test_engine_snippets_parse() -> None:
    daemon = json.loads(docker_daemon_json("/usr/local/bin/scrun"))
    assert daemon["default-runtime"] == "slurm"
    assert daemon["runtimes"]["slurm"]["path"] == "/usr/local/bin/scrun"
    assert daemon["rootless"] is True and daemon["bridge"] == "none"
    assert daemon["iptables"] is False and daemon["ip-forward"] is False
    assert daemon["storage-driver"] == "vfs"  # the nodes read the rootfs (node-local hooks)
    conf = tomllib.loads(podman_containers_conf("/usr/bin/scrun"))
    assert conf["engine"]["runtime"] == "slurm"
    # conmon passes scrun (and so the hooks) only this environment: Podman's default PATH
    assert conf["engine"]["conmon_env_vars"] == [f"PATH={CONMON_PATH}"]
    prefixed = tomllib.loads(podman_containers_conf("/opt/slurm/bin/scrun"))
    assert prefixed["engine"]["conmon_env_vars"] == [f"PATH=/opt/slurm/bin:{CONMON_PATH}"]
    assert conf["engine"]["runtimes"]["slurm"] == ["/usr/bin/scrun"]
    assert conf["containers"]["netns"] == "host"
    with pytest.raises(UsageError):
        podman_containers_conf('/x"]\n[evil')


# -- stage-in/out in Python --------------------------------------------------------------------


def users_stage_dir(stage_dir: Path) -> Path:
    """Where stage-in puts the caller's bundles when STAGE_DIR did not exist (user_stage_dir):
    root makes it shared and sticky and uses ``STAGE_DIR/<uid>``; a user never makes the
    shared one and uses ``STAGE_DIR-<uid>`` beside it."""
    if running_as_root():
        return stage_dir / str(os.getuid())
    return stage_dir.with_name(f"{stage_dir.name}-{os.getuid()}")


def test_stage_in_then_again_is_incremental_and_stage_out_removes(tmp_path: Path) -> None:
    bundle, _rootfs_path = make_engine_bundle(tmp_path, _rootfs(tmp_path / "src"),
                                              minimal_runtime_config())
    cache = tmp_path / "cache"
    request = StageInRequest(container_id="c1", bundle=bundle,
                             config_file=bundle / "config.json", stage_dir=tmp_path / "stage",
                             job_id="4242", uid=os.getuid(), gid=os.getgid(),
                             job_env=["SLURM_JOB_ID=4242"])
    first = stage_in(request, cache_root=cache)
    assert first.files == 7 and first.copied == 7 and first.method == "copy"
    assert first.bundle == users_stage_dir(tmp_path / "stage") / "c1"
    assert (first.root_path / "etc" / "os-release").read_text() == 'NAME="scrun test"\n'
    config = json.loads(first.config.read_text())
    assert config["root"] == {"path": str(first.root_path), "readonly": False}
    leases = all_leases(cache)
    assert [(lease.holder.kind, lease.holder.job_id) for lease in leases] == [
        ("slurm-job", "4242")]
    again = stage_in(request, cache_root=cache)
    assert (again.copied, again.unchanged, again.files) == (0, 7, 7)
    # the JSON line scrun.lua decodes: the keys docs/slurm.md lists, snake_case like every
    # ocistage command's JSON
    assert list(again.to_json()) == ["bundle", "root_path", "config", "files", "copied",
                                     "linked", "unchanged", "bytes_copied", "lease_id",
                                     "method", "dropped", "cleanup_job_id", "cleanup_error"]
    assert stage_out(first.bundle, cache_root=cache) is True
    assert not first.bundle.exists() and not first.root_path.exists()
    assert all_leases(cache) == []
    assert stage_out(first.bundle, cache_root=cache) is False


def test_stage_out_refuses_what_stage_in_did_not_make(tmp_path: Path) -> None:
    bundle, rootfs = make_engine_bundle(tmp_path, _rootfs(tmp_path / "src"),
                                        minimal_runtime_config())
    with pytest.raises(ScrunError, match="not staged"):
        stage_out(bundle, cache_root=tmp_path / "cache")
    assert (bundle / "config.json").exists() and rootfs.exists()
    (bundle / MARKER).write_text(json.dumps({"root_path": str(rootfs)}))
    with pytest.raises(ScrunError, match="outside its bundle"):
        stage_out(bundle, cache_root=tmp_path / "cache")
    assert rootfs.exists()


def test_stage_in_refuses_path_like_container_ids(tmp_path: Path) -> None:
    bundle, _ = make_engine_bundle(tmp_path, _rootfs(tmp_path / "src"),
                                   minimal_runtime_config())
    for bad in ("../x", "a/b", ".hidden", ""):
        with pytest.raises(UsageError):
            stage_in(StageInRequest(container_id=bad, bundle=bundle,
                                    config_file=bundle / "config.json",
                                    stage_dir=tmp_path / "stage"), cache_root=tmp_path / "c")


# -- the Lua, run by lua5.3 --------------------------------------------------------------------


def _lua(script: Path, *args: str, reaped: bool = False) -> dict[str, Any]:
    lua = require_binary("lua5.3")
    env = {**os.environ, "HARNESS_REAPED": "1" if reaped else "0"}
    result = subprocess.run([lua, str(HARNESS), str(script), *args], capture_output=True,
                            text=True, timeout=120, check=False, env=env)
    if "module 'cjson' not found" in result.stderr:
        require_binary("lua-cjson-is-not-installed")  # skips (or fails under REQUIRE_E2E)
    assert result.returncode == 0, result.stderr
    state: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return state


@pytest.mark.parametrize("reaped", [False, True], ids=["status", "status-lost"])
@pytest.mark.parametrize("stage_to", ["shared", "node-local"])
def test_generated_lua_stages_in_and_out_through_ocistage(tmp_path: Path, stage_to: str,
                                                          reaped: bool) -> None:
    """With ``reaped``, scrun lost the commands' exit status (its SIGCHLD handler reaped them,
    about 1 run in 8): the hooks go by the result line each command prints."""
    bundle, _ = make_engine_bundle(tmp_path, _rootfs(tmp_path / "src"),
                                   minimal_runtime_config())
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    script = tmp_path / "scrun.lua"
    script.write_text(render_scrun_lua(ScrunLuaOptions(
        ocistage=OCISTAGE, stage_to=stage_to,  # type: ignore[arg-type]
        stage_dir=str(tmp_path / "stage"), cache=str(tmp_path / "cache"))))
    env = json.dumps(["SLURM_JOB_ID=77", "FROM_JOB=yes"])
    state = _lua(script, "stage-in", "c1", str(bundle), str(spool), str(bundle / "config.json"),
                 "77", str(os.getuid()), str(os.getgid()), env, reaped=reaped)
    assert state["load_rc"] == 0 and state["rc"] == 0
    staged = users_stage_dir(tmp_path / "stage") / "c1"
    assert state["bundle_path"] == str(staged)
    assert state["root_path"] == str(staged / "rootfs")
    kind = "allocator" if stage_to == "shared" else "remote"
    assert [call["kind"] for call in state["calls"]] == [kind]
    assert not (spool / "ocistage-job-env.json").exists()  # removed after use
    config = json.loads((staged / "config.json").read_text())
    assert "FROM_JOB=yes" in config["process"]["env"]
    assert config["root"]["path"] == state["root_path"]
    # stage-out of what stage-in made
    out = _lua(script, "stage-out", "c1", str(staged), str(bundle), state["root_path"],
               "rootfs", str(spool), str(bundle / "config.json"), "77", str(os.getuid()),
               str(os.getgid()), reaped=reaped)
    assert out["rc"] == 0
    assert any("taken as success" in log for log in out["logs"]) == reaped
    # a success says nothing at scrun's default levels: its log is the user's terminal
    assert not [log for log in state["logs"] + out["logs"]
                if not log.startswith(("debug: ", "verbose: "))], state["logs"] + out["logs"]
    assert not staged.exists()
    assert not Path(state["root_path"]).exists()
    assert (bundle / "config.json").exists()  # the engine's bundle is never touched


def test_generated_lua_reports_failures_as_slurm_error(tmp_path: Path) -> None:
    script = tmp_path / "scrun.lua"
    script.write_text(render_scrun_lua(ScrunLuaOptions(
        ocistage=OCISTAGE, stage_dir=str(tmp_path / "stage"), cache=str(tmp_path / "cache"))))
    spool = tmp_path / "spool"
    spool.mkdir()
    missing = tmp_path / "no-such-bundle"
    for reaped in (False, True):
        state = _lua(script, "stage-in", "c1", str(missing), str(spool),
                     str(missing / "config.json"), "1", str(os.getuid()), str(os.getgid()),
                     "[]", reaped=reaped)
        assert state["rc"] == -1
        assert "bundle_path" not in state
        assert any("ocistage scrun stage-in failed (exit " in log for log in state["logs"])
        # with the reason ocistage gave (its stderr), one log line per line
        assert any("no-such-bundle" in log for log in state["logs"]), state["logs"]
    # stage-out when stage-in never ran (bundle == orig_bundle): nothing to do, no command
    out = _lua(script, "stage-out", "c1", str(missing), str(missing), "r", "r", str(spool),
               "c", "1", "0", "0")
    assert out["rc"] == 0 and not out["calls"]  # cjson writes an empty table as {}


def test_generated_lua_says_when_it_cannot_run_ocistage(tmp_path: Path) -> None:
    """The hooks run with the engine's PATH: an ocistage they cannot execute is named, with
    what to do, in scrun's log (the container's output)."""
    missing = tmp_path / "bin" / "ocistage"
    script = tmp_path / "scrun.lua"
    script.write_text(render_scrun_lua(ScrunLuaOptions(
        ocistage=(str(missing),), stage_dir=str(tmp_path / "stage"))))
    spool = tmp_path / "spool"
    spool.mkdir()
    state = _lua(script, "stage-in", "c1", str(tmp_path), str(spool),
                 str(tmp_path / "config.json"), "1", str(os.getuid()), str(os.getgid()), "[]")
    assert state["rc"] == -1
    logs = "\n".join(state["logs"])
    assert "ocistage scrun stage-in failed (exit 127)" in logs
    assert f"{missing}: not found" in logs
    assert "--ocistage /absolute/path/of/ocistage" in logs


def test_scrun_lua_names_this_ocistage_by_absolute_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    options = scrun_lua_options(ocistage=None, stage_to="shared", stage_dir="/s", cache=None,
                                sbatch=None, find_sbatch=False)
    assert options.ocistage == (sys.executable, "-P", "-m", "ocistage")
    assert os.path.isabs(options.ocistage[0])
    # this ocistage imported through PYTHONPATH (a checkout): the hooks get it too
    root = Path(sys.modules["ocistage"].__file__ or "").parent.parent
    monkeypatch.setenv("PYTHONPATH", f"/elsewhere:{root}")
    assert hook_ocistage() == ("/usr/bin/env", f"PYTHONPATH={root.absolute()}",
                               sys.executable, "-P", "-m", "ocistage")
    given = scrun_lua_options(ocistage="/opt/ocistage/bin/ocistage", stage_to="shared",
                              stage_dir="/s", cache=None, sbatch=None, find_sbatch=False)
    assert given.ocistage == ("/opt/ocistage/bin/ocistage",)
    with pytest.raises(UsageError, match="absolute"):
        scrun_lua_options(ocistage="ocistage", stage_to="shared", stage_dir="/s", cache=None,
                          sbatch=None, find_sbatch=False)


def test_this_ocistage_from_scrun_lua_runs() -> None:
    """What the hooks run, with nothing of this environment but the interpreter's own."""
    result = subprocess.run([*hook_ocistage(), "scrun", "--help"], capture_output=True,
                            text=True, timeout=120, check=False, env={"PATH": "/usr/bin:/bin"},
                            cwd="/")
    assert result.returncode == 0, result.stderr
    assert "stage-in" in result.stdout


@pytest.mark.needs_root("maps an unprivileged user in a user namespace")
def test_stage_in_ids_and_home_are_the_hosts_inside_a_user_namespace() -> None:
    """Rootless Podman runs scrun and the hooks in its user namespace, as uid 0 there: the
    job user and the user's home are those of the id outside, not root's."""
    unshare = require_binary("unshare")
    require_python_for(65534)
    code = ("import json; from pathlib import Path; "
            "from ocistage.runtimes.scrun import StageInRequest, ScrunError, job_ids, stage_in; "
            "from ocistage.cache.userdirs import home_dir\n"
            "try:\n"
            " stage_in(StageInRequest('c1', Path('/b'), Path('/b/config.json'), Path('/s')),"
            " cache_root=Path('/c'))\n"
            "except ScrunError as exc:\n"
            " refused = exc.message + ' ' + (exc.hint or '')\n"
            "from ocistage.errors import UsageError\n"
            "try:\n"
            " job_ids(1000, 0)\n"
            " other = ''\n"
            "except UsageError as exc:\n"
            " other = exc.message\n"
            "print(json.dumps([job_ids(0, 0), job_ids(65534, 65534), str(home_dir({})), refused,"
            " other]))")
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", unshare, "--user",
         "--map-root-user", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, check=False, cwd="/",
        env={**os.environ, "HOME": "/root"})
    assert result.returncode == 0, result.stderr
    ids, host_ids, home, refused, other = json.loads(result.stdout)
    assert ids == host_ids == [65534, 65534]
    # another user's id is refused in there too (neither 0 nor the id outside)
    assert other.startswith("--uid 1000 is not yours"), other
    assert home == pwd.getpwuid(65534).pw_dir
    # root's directories show as nobody in there: stage-in refuses before touching anything
    assert "user namespace without the host's root" in refused
    assert "--stage-to node-local" in refused
