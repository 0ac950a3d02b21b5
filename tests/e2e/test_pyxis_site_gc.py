"""A running job's image in a read-only site store and the site's ``cache gc`` (issue 34, item
7; docs/site.md): users leave no lease in a store they only read, so the gc of the configured
``pyxis_store`` retires an image first (no get hands it out from then on) and removes it a grace
later, once any job that was handed it has opened it (a mounted or extracted squashfs needs no
name). Root (the site) fills the store and runs the gc, a created user gets the image and holds
it open as squashfuse does."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_ocistage.components import Registry
from pytest_ocistage.imagebuild import File
from pytest_ocistage.images import ImageRef
from pytest_ocistage.jobuser import JobUser
from pytest_ocistage.plugin import ImageFactory

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root("the site (root) and a created user")]


@dataclass(frozen=True)
class Site:
    store: Path          # root's, 0755: users read it and cannot write it
    user: JobUser

    def home(self, uid: int) -> Path:
        return self.store.parent / str(uid)

    def run(self, uid: int, *args: str, gc_knows_the_store: bool = True
            ) -> subprocess.CompletedProcess[str]:
        """``ocistage-pyxis-importer ARGS`` (``ocistage ARGS`` for ``cache``) as ``uid``, with
        ``pyxis_store`` the site's store (for root's gc too, unless ``gc_knows_the_store`` is
        false: a gc run with another configuration)."""
        home = self.home(uid)
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
               "HOME": str(home), "OCISTAGE_CACHE": str(home / "cache"),
               "XDG_CONFIG_HOME": str(home / ".config"), "NO_PROXY": "127.0.0.1,localhost"}
        if gc_knows_the_store or args[0] != "cache":
            env["OCISTAGE_PYXIS_STORE"] = str(self.store)
        module = "ocistage" if args[0] == "cache" else "ocistage.bundler.pyxis.main"
        gid = 0 if uid == 0 else self.user.gid
        return subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
             "sh", "-c", 'umask 022; exec "$@"', "sh", sys.executable, "-m", module, *args],
            env=env, cwd="/", capture_output=True, text=True, timeout=300, check=False,
            stdin=subprocess.DEVNULL)


@pytest.fixture
def site(slurm_job_user: JobUser) -> Iterator[Site]:
    base = Path(tempfile.mkdtemp(prefix="ocistage-site-gc-", dir="/tmp"))
    made = Site(base / "store", slurm_job_user)
    try:
        base.chmod(0o755)
        made.store.mkdir(mode=0o755)
        for uid, gid in ((0, 0), (slurm_job_user.uid, slurm_job_user.gid)):
            made.home(uid).mkdir(mode=0o700)
            os.chown(made.home(uid), uid, gid)
        yield made
    finally:
        shutil.rmtree(base)


@pytest.fixture
def image(oci_image: ImageFactory, oci_registry: Registry) -> ImageRef:
    built = oci_image({"data/blob": File(os.urandom(1 << 20)), "etc/hostname": "x\n"},
                      cmd=["/data/blob"])
    return built.push(oci_registry, "pyxis/site-gc", "1")


def uri(image: ImageRef) -> str:
    return f"docker://{image.registry.host}#{image.repository}:1"


def got(result: subprocess.CompletedProcess[str]) -> Path:
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip())


def holding_open(site: Site, path: Path) -> subprocess.Popen[str]:
    """A process of the user that has ``path`` open (as squashfuse has a mounted image) and
    prints its sha256 once told to read it (a line on stdin)."""
    code = ("import hashlib, sys\n"
            "f = open(sys.argv[1], 'rb')\n"
            "print('open', flush=True)\n"
            "sys.stdin.readline()\n"
            "print(hashlib.sha256(f.read()).hexdigest(), flush=True)\n")
    holder = subprocess.Popen(
        ["setpriv", f"--reuid={site.user.uid}", f"--regid={site.user.gid}", "--clear-groups",
         sys.executable, "-c", code, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    assert holder.stdout is not None and holder.stdout.readline() == "open\n"
    return holder


def test_the_sites_gc_retires_an_image_a_job_was_handed_and_removes_it_a_grace_later(
        site: Site, image: ImageRef) -> None:
    """Before: the site's ``cache gc --older-than`` removed the image at once, between a
    job's get and pyxis opening it."""
    store, user = site.store, site.user.uid
    path = got(site.run(0, "get", uri(image)))  # the site fills its store
    assert path.parent == store / "pyxis"
    assert site.run(0, "release").returncode == 0
    handed = got(site.run(user, "get", uri(image)))  # a job's get: no lease, no record
    assert handed == path
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    gc = site.run(0, "cache", "gc", "--cache", str(store), "--older-than", "0")
    assert gc.returncode == 0, gc.stderr
    assert path.is_file(), "the gc removed an image a job had just been handed"
    key = path.name.removesuffix(".sqsh")
    assert (store / "pyxis" / "retired" / key).is_file()
    holder = holding_open(site, path)  # pyxis opens what the get printed: it is still there
    try:
        again = got(site.run(user, "get", uri(image)))  # a later job: not the retired image
        assert again.parent == site.home(user) / "cache" / "pyxis"
        kept = site.run(0, "cache", "gc", "--cache", str(store), "--older-than", "0")
        assert kept.returncode == 0 and path.is_file(), kept.stdout + kept.stderr
        past = os.stat(store / "pyxis" / "retired" / key).st_mtime - 3601
        os.utime(store / "pyxis" / "retired" / key, (past, past))  # the grace has passed
        later = site.run(0, "cache", "gc", "--cache", str(store))
        assert later.returncode == 0, later.stderr
        assert not path.exists() and not (store / "pyxis" / "retired" / key).exists()
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.write("read\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == digest  # an opened image needs no name
    finally:
        holder.kill()
        holder.wait()


def test_a_gc_that_does_not_know_the_store_is_the_sites_removes_at_once(
        site: Site, image: ImageRef) -> None:
    """The retirement is the site's store's (``pyxis_store`` of the gc's settings): a store
    gc'd under another configuration (a user's own cache) loses an evicted image at once."""
    path = got(site.run(0, "get", uri(image)))
    assert site.run(0, "release").returncode == 0
    gc = site.run(0, "cache", "gc", "--cache", str(site.store), "--older-than", "0",
                  gc_knows_the_store=False)
    assert gc.returncode == 0, gc.stderr
    assert not path.exists()
