"""A mandatory site policy for an ordinary user: ``policy_mandatory`` in the site config file
applies the site's policy to ``pull``, ``bundle``, ``submit`` (its refusal) and
``ocistage-pyxis-importer get`` run as nobody, whose own policy file, config keys and
``--policy`` would accept anything.

The site config is ``/etc/ocistage/config.toml``: the test never writes the machine's /etc.
Each command runs in a private mount namespace where /etc is an overlay of the real one and a
private upper directory holding ``ocistage/config.toml`` (root sets it up, then ``setpriv``
becomes nobody); the namespace ends with the command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ocistage.components import require_binary, require_root
from pytest_ocistage.runner import ocistage_command

# the oracle module's fixture (signed images, keys, lookaside)
from tests.e2e.test_trust_oracle import (
    World,
    trust_files,
    world,  # noqa: F401
)

pytestmark = pytest.mark.e2e

NOBODY = 65534
ACCEPT_ALL = json.dumps({"default": [{"type": "insecureAcceptAnything"}]})


@pytest.fixture
def site(world: World) -> Iterator[Path]:  # noqa: F811
    """A world-readable base: the site's policy, key, registries.d and lookaside; the /etc
    overlay's upper and work directories; nobody's HOME with an accept-anything policy."""
    require_root()  # needs root: a private mount namespace, then setpriv to nobody
    for tool in ("unshare", "setpriv", "mount"):
        require_binary(tool, "util-linux" if tool != "mount" else "mount")
    base = Path(tempfile.mkdtemp(prefix="ocistage-trust-site-", dir="/tmp"))
    try:
        base.chmod(0o755)
        site = base / "site"
        trust_files(world, site)
        upper = base / "etc-upper" / "ocistage"
        upper.mkdir(parents=True)
        (upper / "config.toml").write_text(
            f'policy_mandatory = true\npolicy = "{site / "policy.json"}"\n'
            f'registries_d = "{site / "registries.d"}"\n')
        (base / "etc-work").mkdir()
        home = base / "home"
        (home / ".config" / "containers").mkdir(parents=True)
        (home / ".config" / "ocistage").mkdir(parents=True)
        (home / ".config" / "containers" / "policy.json").write_text(ACCEPT_ALL)
        (home / "accept.json").write_text(ACCEPT_ALL)
        (home / ".config" / "ocistage" / "config.toml").write_text(
            f'policy = "{home / "accept.json"}"\npolicy_mandatory = false\n')
        for path in [home, *home.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
        home.chmod(0o700)
        for path in [site, *site.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield base
    finally:
        subprocess.run(["chmod", "-R", "u+rwX", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def as_user_with_site(base: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    home = base / "home"
    script = ('mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc '
              '&& shift 2 && exec "$@"')
    environment = [f"HOME={home}", f"OCISTAGE_CACHE={home}/cache",
                   f"XDG_CONFIG_HOME={home}/.config", f"XDG_CACHE_HOME={home}/.cache",
                   "PATH=/usr/bin:/bin:/usr/sbin:/sbin", "NO_PROXY=127.0.0.1,localhost",
                   "SLURM_JOB_ID=4242", "SLURM_STEP_ID=0"]
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
         str(base / "etc-upper"), str(base / "etc-work"),
         "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         "env", "-i", *environment, *argv],
        capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)


def test_a_mandatory_site_policy_binds_an_ordinary_user(world: World,  # noqa: F811
                                                        site: Path) -> None:
    ocistage = ocistage_command()
    importer = [str(Path(ocistage[0]).parent / "ocistage-pyxis-importer")] \
        if len(ocistage) == 1 else None
    unsigned, signed = world.ref("unsigned:1"), world.ref("signed:1")
    accept = f"--policy={site / 'home' / 'accept.json'}"
    for command in (("pull", accept), ("bundle", accept)):
        refused = as_user_with_site(site, *ocistage, *command, unsigned)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"error: {unsigned} is rejected by the policy {site / 'site/policy.json'}" \
            in refused.stderr
        assert "is ignored: the site makes its image policy mandatory" in refused.stderr
        assert "Traceback" not in refused.stderr
        admitted = as_user_with_site(site, *ocistage, *command, signed)
        assert admitted.returncode == 0, admitted.stderr
    # submit decides in the same pull, before anything is staged or sbatch runs (a cluster
    # for the admitted image is the Slurm e2e's; here the refusal, on the submitting host)
    stage = site / "home" / "stage"
    refused = as_user_with_site(site, *ocistage, "submit", accept, f"--stage-to={stage}",
                                unsigned, "--", "true")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"error: {unsigned} is rejected by the policy" in refused.stderr
    assert not stage.exists() or not any(stage.iterdir())
    if importer is None or not Path(importer[0]).is_file():
        pytest.skip("ocistage-pyxis-importer is not beside the ocistage script")
    uri = unsigned.replace("/", "#", 1)
    refused = as_user_with_site(site, *importer, "get", uri)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert "is rejected by the policy" in refused.stderr, refused.stderr
    admitted = as_user_with_site(site, *importer, "get", signed.replace("/", "#", 1))
    assert admitted.returncode == 0, admitted.stderr
