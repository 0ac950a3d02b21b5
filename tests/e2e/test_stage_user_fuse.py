"""``stage --format squashfs --mount`` by an ordinary user (issue 34): where ``/dev/fuse`` is open
to them (Debian's 0666) the image is mounted, read through and unstaged; where it is root's
alone (0600, as on this build host) the stage fails naming ``/dev/fuse`` and the way out,
where it used to say "install squashfuse and fuse3" (which were installed).

Each case runs a created user (``useradd``, ``setpriv``) in a private mount namespace holding a
``/dev/fuse`` of the mode under test (a device node of its own bind-mounted over the host's,
as the Slurm fixtures give job users FUSE), so the host's device is never changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cotenant import OCISTAGE, User, created_user, require_python_for
from tests.stagers.conftest import require_fuse_mount

pytestmark = pytest.mark.needs_root("a mount namespace with a /dev/fuse of its own needs root")

#: runs in the namespace: a tmpfs holding a /dev/fuse node of mode $2 bind-mounted over the
#: host's, then the user's steps (each one's outcome in a file of $OUT; every step runs)
NAMESPACE = """
mount -t tmpfs -o mode=0755 fuse "$1"
mknod -m "$2" "$1/fuse" c 10 229
mount --bind "$1/fuse" /dev/fuse
shift 2
exec "$@"
"""
USER_STEPS = """
cd /
"$OCISTAGE" stage "$TREE" --to "$TARGET" --name x --format squashfs --mount --json \
    >"$OUT/stage.json" 2>"$OUT/stage.err"
echo $? >"$OUT/stage.rc"
grep -F " $TARGET/x " /proc/self/mountinfo >"$OUT/mounted"
cat "$TARGET/x/rootfs/file" >"$OUT/read" 2>&1
if [ -e "$TARGET/x/rootfs" ]; then
    "$OCISTAGE" unstage "$TARGET/x" >/dev/null 2>"$OUT/unstage.err"
    echo $? >"$OUT/unstage.rc"
fi
grep -F " $TARGET/x " /proc/self/mountinfo >"$OUT/after"
fusermount3 -u -z "$TARGET/x" 2>/dev/null  # only if a step above failed
exit 0
"""


@pytest.fixture
def user() -> Iterator[User]:
    with created_user() as made:
        require_python_for(made.uid)
        try:
            yield made
        finally:
            _stop_processes_of(made.uid)  # a FUSE server left by a failed step


def _stop_processes_of(uid: int) -> None:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                continue


def stage_in_namespace(user: User, base: Path, fuse_mode: str) -> dict[str, str]:
    """Stage ``base/tree`` to ``base/target`` as ``user`` with ``--mount`` where /dev/fuse has
    ``fuse_mode``; what each step left in its file."""
    tree, target, out, device = (base / name for name in ("tree", "target", "out", "dev"))
    (tree / "rootfs").mkdir(parents=True)
    (tree / "rootfs" / "file").write_text("read through FUSE\n")
    device.mkdir()
    for directory in (target, out):
        directory.mkdir()
        os.chown(directory, user.uid, user.gid)
    env = {**user.env(base), "OCISTAGE": OCISTAGE, "TREE": str(tree), "TARGET": str(target),
           "OUT": str(out)}
    as_user = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
               "env", "-i", *(f"{key}={value}" for key, value in env.items()),
               "sh", "-c", USER_STEPS]
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-ec",
                             NAMESPACE, "namespace", str(device), fuse_mode, *as_user],
                            capture_output=True, text=True, timeout=300, check=False, cwd="/")
    assert result.returncode == 0, result.stderr
    return {path.name: path.read_text() for path in out.iterdir()}


@pytest.fixture
def base() -> Iterator[Path]:
    """A root-owned 0755 directory in /tmp the user can reach (root's tmp_path is private)."""
    with tempfile.TemporaryDirectory(prefix="ocistage-fuse-") as directory:
        os.chmod(directory, 0o755)
        yield Path(directory)


def test_a_user_mounts_a_squashfs_stage_where_dev_fuse_is_open_to_them(
        user: User, base: Path) -> None:
    require_fuse_mount("fusermount3")
    found = stage_in_namespace(user, base, "0666")
    assert found["stage.rc"].strip() == "0", found.get("stage.err")
    assert json.loads(found["stage.json"])["method"] == "squashfs-mount"
    assert " fuse.squashfuse" in found["mounted"]  # the user's FUSE mount, not an unpack
    assert found["read"] == "read through FUSE\n"
    assert found["unstage.rc"].strip() == "0", found.get("unstage.err")
    assert found["after"] == ""  # unstage unmounted it
    assert not [name for name in os.listdir(base / "target") if not name.startswith(".")]


def test_stage_mount_names_a_dev_fuse_the_user_may_not_open(user: User, base: Path) -> None:
    require_fuse_mount("fusermount3")
    found = stage_in_namespace(user, base, "0600")
    assert found["stage.rc"].strip() == "1"
    error = found["stage.err"]
    assert "/dev/fuse (crw-------, uid 0) is not open to you" in error, error
    assert "stage without --mount" in error and "install squashfuse" not in error
    assert "Traceback" not in error
    assert found["mounted"] == "" and "unstage.rc" not in found
    assert not [name for name in os.listdir(base / "target") if not name.startswith(".")]
