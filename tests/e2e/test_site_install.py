"""A site install for every user (docs/site.md; issue 38): a wheelhouse as ``make site-wheelhouse``
makes on the "connected" side, ``make site-install PREFIX=... WHEELHOUSE=...`` as root in a
network namespace without a network (so nothing can come from an index), run from a copy of this
checkout into a scratch prefix under /tmp with umask 077, then used by a created user (no sudo,
no login session): the commands, ``doctor``, the man pages, bash completion, the Lmod and Tcl
modulefiles under Lmod, and a real ``bundle``. Upgraded in place twice, then uninstalled: what
is left is the user's cache.

The test makes the wheelhouse without a network, as tests reach no address but this machine's:
the wheel of the checkout (``make dist``) and the wheels of what it needs, repacked from this
venv's installed distributions (their RECORD and WHEEL tags). ``make site-wheelhouse`` itself
(``pip download``) needs the package index and is not run here.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from pytest_ocistage.components import component_unavailable, require_binary
from pytest_ocistage.imagebuild import build_image, busybox_layer
from pytest_ocistage.jobuser import JobUser, job_user_account
from tests.plugin.checkout import REPO, checkout_copy

needs_root = pytest.mark.needs_root("a site install for a created user (useradd)")
SCRIPT = REPO / "scripts" / "site-install.sh"

SITE_USER = "ocistage-site"
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
STAMP = re.compile(r"^[0-9]{8}T[0-9]{6}-[0-9]+$")


def _repack(dist: metadata.Distribution, wheelhouse: Path) -> Path:
    """The installed distribution ``dist`` as the wheel it was installed from: the files its
    RECORD names (scripts, which pip makes again, left out) and its WHEEL tags."""
    info = Path(str(dist.locate_file(""))) / next(
        str(f.parent) for f in dist.files or [] if f.name == "WHEEL")
    tags = [line.split(":", 1)[1].strip().split("-") for line in (info / "WHEEL").read_text()
            .splitlines() if line.startswith("Tag:")]
    # several tags are one compressed tag set in the name (py2.py3-none-any)
    tag = "-".join(".".join(dict.fromkeys(parts[i] for parts in tags)) for i in range(3))
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    wheel = wheelhouse / f"{name}-{dist.version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for entry in dist.files or []:
            if entry.parts[0] == ".." or "__pycache__" in entry.parts:
                continue
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                archive.write(path, entry.as_posix())
    return wheel


def _runtime_requirements() -> list[str]:
    """``name==version`` of every distribution ocistage needs at run time, as installed here."""
    seen: dict[str, str] = {}
    todo = ["ocistage"]
    while todo:
        dist = metadata.distribution(todo.pop())
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if key in seen:
            continue
        seen[key] = dist.version
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            match = re.match(r"[A-Za-z0-9_.-]+", requirement)
            assert match is not None, requirement
            try:
                metadata.distribution(match.group(0))
            except metadata.PackageNotFoundError:
                continue  # an environment marker excluded it here
            todo.append(match.group(0))
    del seen["ocistage"]
    return [f"{name}=={version}" for name, version in sorted(seen.items())]


@pytest.fixture
def scratch() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="ocistage-site-", dir="/tmp"))
    try:
        top.chmod(0o755)
        yield top
    finally:
        shutil.rmtree(top)


@pytest.fixture
def site_user() -> Iterator[JobUser]:
    try:
        pwd.getpwnam(SITE_USER)
        pytest.fail(f"user {SITE_USER} exists already: a previous run was killed; "
                    f"userdel --remove {SITE_USER}", pytrace=False)
    except KeyError:
        pass
    with job_user_account(SITE_USER) as user:
        yield user


def _run(argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env,
                            timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    assert result.returncode == 0, (f"{argv} exited {result.returncode}\n"
                                    f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


def _as_user(user: JobUser, script: str, *args: str,
             check: bool = True) -> subprocess.CompletedProcess[str]:
    """bash -c script as user, in the environment of a non-login process (no session)."""
    env = {"HOME": str(user.home), "USER": user.name, "LOGNAME": user.name,
           "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8",
           "NO_COLOR": "1"}
    argv = user.argv("env", "-i", *(f"{key}={value}" for key, value in env.items()),
                     "bash", "-c", script, "bash", *args)
    result = subprocess.run(argv, capture_output=True, text=True, cwd="/", timeout=120,
                            stdin=subprocess.DEVNULL, check=False)
    if check:
        assert result.returncode == 0, (f"as {user.name}: {script} {args} exited "
                                        f"{result.returncode}\nstdout:\n{result.stdout}\n"
                                        f"stderr:\n{result.stderr}")
    return result


def _site_install(source: Path, prefix: Path, wheelhouse: Path) -> str:
    """make site-install as root with umask 077, in a network namespace with no network."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
           "LANG": "C.UTF-8"}
    result = _run(["unshare", "--net", "bash", "-c", 'umask 077 && exec make "$@"', "make",
                   "--no-print-directory", "site-install", f"PREFIX={prefix}",
                   f"WHEELHOUSE={wheelhouse}"], cwd=source, env=env)
    return result.stdout


@pytest.mark.parametrize("prefix", [
    "relative/opt", "/", "/tmp/a b", "/tmp/a:b", "/tmp/$(touch x)", "/tmp/a\nb", "/tmp/a]]b",
    "/tmp/{x}", '/tmp/a"b', "/tmp/a\\b", "/tmp/../etc", "/tmp/./x", "/tmp//x"])
def test_a_prefix_the_written_files_cannot_carry_is_refused_before_anything_is_written(
        tmp_path: Path, prefix: str) -> None:
    for flags in ([], ["--uninstall"]):
        result = subprocess.run(["bash", str(SCRIPT), *flags, "--", prefix],
                                capture_output=True, text=True, cwd=tmp_path, timeout=60,
                                stdin=subprocess.DEVNULL, check=False)
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith("site-install: error: PREFIX "), result.stderr
        assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


@needs_root
def test_a_site_install_serves_a_created_user_and_leaves_only_their_cache(
        scratch: Path, site_user: JobUser) -> None:
    require_binary("make")
    require_binary("man", "man-db")
    require_binary("unshare", "util-linux")
    require_binary("busybox", "busybox-static")
    if not LMOD_INIT.exists():
        component_unavailable("Lmod not installed: apt-get install lmod (the modulefiles are "
                              "loaded with it)")
    home_before = {entry.name for entry in site_user.home.iterdir()}
    source = checkout_copy(scratch / "src")

    # the connected side's wheelhouse, made here without a network (test traffic stays on
    # this machine): the wheel of this checkout (make dist) beside the wheels of what it needs,
    # repacked from this venv's installed distributions (`make site-wheelhouse` is that with
    # `pip download`, on a machine with the internet)
    wheelhouse = scratch / "wheelhouse"
    wheelhouse.mkdir()
    built = subprocess.run(["make", "--no-print-directory", "dist", f"VENV={sys.prefix}"],
                           cwd=source, capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    for wheel in (source / "dist").glob("ocistage-*-py3-none-any.whl"):
        shutil.copy2(wheel, wheelhouse)
    for requirement in _runtime_requirements():
        _repack(metadata.distribution(requirement.partition("==")[0]), wheelhouse)
    wheels = sorted(path.name for path in wheelhouse.iterdir())
    assert any(name.startswith("ocistage-") for name in wheels), wheels
    assert any(name.startswith("isal-") for name in wheels), wheels

    prefix = scratch / "site" / "opt"
    (scratch / "site").mkdir(mode=0o755)
    printed = _site_install(source, prefix, wheelhouse)
    version = metadata.version("ocistage")
    importer = prefix / "bin" / "ocistage-pyxis-importer"
    assert (f"required /usr/lib/slurm/spank_pyxis.so importer={importer}\n") in printed
    first_venv = os.readlink(prefix / "venv")
    assert first_venv.startswith("venvs/") and STAMP.match(first_venv.split("/")[1])

    # every user can read and run it all, whatever the admin's umask; nobody else can write it
    for path in [prefix, *prefix.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        assert mode & 0o022 == 0, f"{path} is writable by others: {oct(mode)}"
        wanted = 0o005 if path.is_dir() else 0o004
        assert mode & wanted == wanted, f"{path} is not readable by others: {oct(mode)}"

    # nothing was left in the copy of the checkout but the wheel `make dist` wrote
    assert not (source / "build").exists()

    user = site_user
    out = _as_user(user, f"{prefix}/bin/ocistage --version && "
                         f"{importer} --help >/dev/null && echo importer-ok").stdout
    assert out == f"ocistage {version}\nimporter-ok\n"

    doctor = _as_user(user, f"{prefix}/bin/ocistage doctor --json", check=False)
    report = json.loads(doctor.stdout)
    assert doctor.returncode == (0 if report["ok"] else 1), doctor.stderr
    assert report["user"] == user.name
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["cache"]["status"] == "ok", checks["cache"]

    for page in ("ocistage", "ocistage-pyxis-importer"):
        shown = _as_user(user, 'MANWIDTH=80 man --warnings -M "$1" -P cat "$2"',
                         str(prefix / "share" / "man"), page)
        assert shown.stderr == ""
        assert "NAME" in shown.stdout and page in shown.stdout

    completion = prefix / "share" / "bash-completion" / "completions" / "ocistage"
    assert _as_user(user, 'source "$1" && complete -p ocistage', str(completion)).stdout == (
        "complete -o default -F _ocistage_completion ocistage\n")

    # the modulefiles under Lmod: the Lua one (with completion), then the Tcl one alone
    tcl_only = scratch / "tcl-modules"
    (tcl_only / "ocistage").mkdir(parents=True)
    shutil.copy(prefix / "modulefiles" / "ocistage" / version, tcl_only / "ocistage" / version)
    tcl_only.chmod(0o755)
    (tcl_only / "ocistage").chmod(0o755)
    module_script = (f"source {LMOD_INIT} && module use \"$1\" && module load ocistage/{version}"
                     " && command -v ocistage && man -w ocistage && man -w ls"
                     " && { complete -p ocistage || true; }"
                     " && module unload ocistage && echo \"unloaded:$PATH\"")
    lua = _as_user(user, module_script, str(prefix / "modulefiles")).stdout.splitlines()
    assert lua == [f"{prefix}/bin/ocistage", f"{prefix}/share/man/man1/ocistage.1",
                   "/usr/share/man/man1/ls.1.gz",
                   "complete -o default -F _ocistage_completion ocistage",
                   "unloaded:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"]
    tcl = _as_user(user, module_script, str(tcl_only)).stdout.splitlines()
    assert tcl == [line for line in lua if not line.startswith("complete ")]

    # a real bundle of a local layout, as that user, into the default cache (~/.cache)
    work = scratch / "work"
    work.mkdir()
    build_image(work / "layout", [busybox_layer()], cmd=["sh", "-c", "echo hi"])
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(work)], check=True)
    bundled = _as_user(user, f'{prefix}/bin/ocistage bundle -q "oci:$1/layout:latest" "$1/b"',
                       str(work))
    assert bundled.stdout.strip() == str(work / "b")
    assert (work / "b" / "rootfs" / "bin" / "busybox").is_file()
    assert json.loads((work / "b" / "config.json").read_text())["process"]["args"] == [
        "sh", "-c", "echo hi"]

    # upgrades in place: a new venv beside, switched by a rename; the replaced one kept, one
    # replaced before it removed
    _site_install(source, prefix, wheelhouse)
    second_venv = os.readlink(prefix / "venv")
    assert second_venv != first_venv
    assert (prefix / first_venv).is_dir()
    assert _as_user(user, f"{prefix}/bin/ocistage --version").stdout == f"ocistage {version}\n"
    _site_install(source, prefix, wheelhouse)
    assert sorted(path.name for path in (prefix / "venvs").iterdir()) == sorted(
        [second_venv.split("/")[1], os.readlink(prefix / "venv").split("/")[1]])

    # uninstall: the prefix is gone (the script made it), the user's cache stays
    _run(["make", "--no-print-directory", "site-uninstall", f"PREFIX={prefix}"], cwd=source)
    assert not prefix.exists()
    assert list((scratch / "site").iterdir()) == []
    made_by_user = {entry.name for entry in user.home.iterdir()} - home_before
    assert made_by_user == {".cache"}, made_by_user
    assert (user.home / ".cache" / "ocistage").is_dir()
    leftovers = [str(path) for path in Path("/tmp").iterdir()
                 if path.lstat().st_uid == user.uid]
    assert leftovers == []
