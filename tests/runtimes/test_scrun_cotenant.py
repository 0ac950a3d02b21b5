"""scrun stage-in on a node shared with other users (issue 27 item 2, docs/trust.md "STAGE_DIR"):
real second and third users (``setpriv``: nobody and uid 65533) make STAGE_DIR first, stage in
themselves, and try to swap what root's stage-in hands to slurmstepd."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ocistage.runtimes.scrun import StageInRequest, stage_in
from tests.runtimes.scrun_bundle import make_engine_bundle, minimal_runtime_config

NOBODY = 65534
OTHER = 65533  # a second unprivileged user; no passwd entry is needed
OCISTAGE = (sys.executable, "-c", "from ocistage.bundler.cli.app import main; main()")

pytestmark = pytest.mark.needs_root("other users need root and setpriv")


def _as(uid: int, *argv: str, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           *argv], capture_output=True, text=True, timeout=300, check=check,
                          env=env, cwd="/")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory like ``/tmp``: root's, sticky, every user can make entries in it."""
    base = Path(tempfile.mkdtemp(prefix="ocistage-cotenant-", dir="/tmp"))
    base.chmod(0o1777)
    yield base
    shutil.rmtree(base)


@pytest.fixture
def engine(shared: Path) -> Path:
    """An engine's bundle every user can read (root's, in ``shared``)."""
    source = shared / "src"
    (source / "bin").mkdir(parents=True)
    (source / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    source.chmod(0o755)
    bundle, _ = make_engine_bundle(shared / "engine", source, minimal_runtime_config())
    return bundle


def _root_stage_in(engine: Path, stage_dir: Path, cache: Path) -> Any:
    return stage_in(StageInRequest(container_id="c1", bundle=engine,
                                   config_file=engine / "config.json", stage_dir=stage_dir,
                                   uid=0, gid=0), cache_root=cache)


def _user_stage_in(uid: int, engine: Path, stage_dir: Path, *ids: str) -> Path:
    """``ocistage scrun stage-in`` as ``uid``, as scrun.lua runs it (``ids``: its ``--uid``
    and ``--gid`` options); the bundle it printed."""
    result = _user_stage_in_result(uid, engine, stage_dir, *ids)
    assert result.returncode == 0, result.stderr
    bundle = Path(json.loads(result.stdout.strip().splitlines()[-1])["bundle"])
    assert (bundle / "config.json").stat().st_uid == uid
    return bundle


def _user_stage_in_result(uid: int, engine: Path, stage_dir: Path,
                          *ids: str) -> subprocess.CompletedProcess[str]:
    home = stage_dir.parent / f"home-{uid}"
    _as(uid, "mkdir", "-p", str(home))
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_CACHE_HOME": str(home / ".cache")}
    return _as(uid, *OCISTAGE, "scrun", "stage-in", "--id", "c1", "--bundle", str(engine),
               "--stage-dir", str(stage_dir), "--cache", str(home / "cache"), *ids,
               check=False, env=env)


@pytest.mark.parametrize("ids", [("--uid", str(OTHER)), ("--uid", "1"),
                                 ("--uid", str(NOBODY), "--gid", str(OTHER))],
                         ids=["another-uid", "a-system-uid", "another-gid"])
def test_a_user_cannot_stage_in_for_another_user(shared: Path, engine: Path,
                                                 ids: tuple[str, ...]) -> None:
    """Before: exit 0, the --uid silently ignored and the bundle staged as the caller."""
    stage_dir = shared / "stage"
    result = _user_stage_in_result(NOBODY, engine, stage_dir, *ids)
    assert result.returncode == 2, result.stderr
    kind, given = ids[-2].removeprefix("--"), ids[-1]
    assert result.stderr.startswith(f"error: --{kind} {given} is not yours"), result.stderr
    assert "only root stages for other users" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert sorted(os.listdir(shared)) == ["engine", f"home-{NOBODY}", "src"]  # nothing staged
    assert not (shared / f"home-{NOBODY}" / "cache").exists()


@pytest.mark.parametrize("ids", [(), ("--uid", str(NOBODY), "--gid", str(NOBODY)),
                                 ("--uid", "0", "--gid", "0")],
                         ids=["none", "own", "as-rootless-podman-maps-it"])
def test_a_user_stages_in_for_itself(shared: Path, engine: Path, ids: tuple[str, ...]) -> None:
    bundle = _user_stage_in(NOBODY, engine, shared / "stage", *ids)
    config = json.loads((bundle / "config.json").read_text())
    outside = {(m["hostID"], m["size"]) for m in config["linux"]["uidMappings"]}
    assert (NOBODY, 1) in outside  # the job user is the caller, whatever --uid said


@pytest.mark.parametrize("mode", [0o777, 0o755], ids=oct)
def test_a_stage_dir_a_cotenant_made_first_cannot_swap_roots_bundle(
        shared: Path, engine: Path, tmp_path: Path, mode: int) -> None:
    stage_dir = shared / "stage"
    _as(NOBODY, "mkdir", "-m", f"{mode:o}", str(stage_dir))
    result = _root_stage_in(engine, stage_dir, tmp_path / "cache")
    # she swaps the directory above what stage-in returned and writes her own config.json
    # (root.path /, her command) where slurmstepd will look for it
    evil = json.dumps({"ociVersion": "1.0.2", "root": {"path": "/"},
                       "process": {"args": ["/bin/sh", "-c", "id > /tmp/owned"]}})
    swap = _as(NOBODY, "sh", "-c", 'd=$(dirname "$1") && mv "$d" "$d.old" && mkdir -p "$1" '
               '&& printf %s "$2" > "$1/config.json"', "swap", str(result.bundle), evil,
               check=False)
    assert swap.returncode != 0, f"the swap worked: {result.bundle}"
    config = json.loads(result.config.read_text())
    assert config["root"]["path"] == str(result.root_path)
    assert result.config.stat().st_uid == 0
    assert os.listdir(stage_dir) == []  # nothing of root's in her directory
    assert result.bundle == shared / "stage-0" / "c1"


def test_later_users_stage_in_whoever_came_first(shared: Path, engine: Path,
                                                 tmp_path: Path) -> None:
    stage_dir = shared / "stage"
    first = _user_stage_in(NOBODY, engine, stage_dir)
    second = _user_stage_in(OTHER, engine, stage_dir)
    # an unprivileged first user cannot make a directory everybody can trust: her own beside it
    assert first == shared / f"stage-{NOBODY}" / "c1"
    assert second == shared / f"stage-{OTHER}" / "c1"
    assert not stage_dir.exists()
    # root makes STAGE_DIR root's and sticky, as /tmp; then everybody's go there
    assert _root_stage_in(engine, stage_dir, tmp_path / "cache").bundle == stage_dir / "0" / "c1"
    assert stage_dir.stat().st_mode & 0o7777 == 0o1777 and stage_dir.stat().st_uid == 0
    assert _user_stage_in(NOBODY, engine, stage_dir) == stage_dir / str(NOBODY) / "c1"
    # and nobody can take another's place there: OTHER's name is made by OTHER
    _as(NOBODY, "mkdir", "-m", "777", str(stage_dir / str(OTHER)))
    result = _as(OTHER, *OCISTAGE, "scrun", "stage-in", "--id", "c1", "--bundle", str(engine),
                 "--stage-dir", str(stage_dir), "--cache", str(shared / f"home-{OTHER}" / "c"),
                 check=False, env={**os.environ, "HOME": str(shared / f"home-{OTHER}")})
    assert result.returncode == 1 and "owned by" in result.stderr, result.stderr


def test_a_stage_dir_root_left_0755_does_not_lock_users_out(shared: Path,
                                                            engine: Path) -> None:
    stage_dir = shared / "stage"
    stage_dir.mkdir(mode=0o755)  # as root's first stage-in made it before
    assert _user_stage_in(NOBODY, engine, stage_dir) == shared / f"stage-{NOBODY}" / "c1"
    # a site that made the users' directories in it: they are used
    (stage_dir / str(OTHER)).mkdir(mode=0o700)
    os.chown(stage_dir / str(OTHER), OTHER, OTHER)
    assert _user_stage_in(OTHER, engine, stage_dir) == stage_dir / str(OTHER) / "c1"
