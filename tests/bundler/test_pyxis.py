"""ocistage-pyxis-importer's library (bundler/pyxis/): enroot's image URIs and
credentials, the files enroot writes into a rootfs, the mksquashfs command, and the store:
leases per job step, one build for many processes asking at once."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ocistage.bundler.errors import PyxisImportError
from ocistage.bundler.image.errors import InvalidReference
from ocistage.bundler.pyxis.credentials import EnrootCredentials, parse_netrc
from ocistage.bundler.pyxis.enroot_files import enroot_files
from ocistage.bundler.pyxis.imagekey import image_key
from ocistage.bundler.pyxis.imagestore import ImageStore
from ocistage.bundler.pyxis.jobstep import JobStep
from ocistage.bundler.pyxis.main import VOICE, run
from ocistage.bundler.pyxis.mksquashfs import (
    DEFAULT_COMPRESSIONS,
    mksquashfs_argv,
    mksquashfs_error,
    run_mksquashfs,
)
from ocistage.bundler.pyxis.refnotes import recall
from ocistage.bundler.pyxis.uri import parse_enroot_uri
from ocistage.cache import leases
from ocistage.cache.store import Store
from ocistage.stagers.mksquashfs import compressors_listed, pseudo_dir, pseudo_file
from ocistage.stagers.squashfs_compression import Compression
from pytest_ocistage.components import require_binary
from tests.deadline import deadline


@pytest.mark.parametrize(("uri", "user", "expected"), [
    ("docker://ubuntu", None, "docker.io/library/ubuntu:latest"),
    ("docker://ubuntu:24.04", None, "docker.io/library/ubuntu:24.04"),
    ("ubuntu:24.04", None, "docker.io/library/ubuntu:24.04"),
    ("docker://nvcr.io#nvidia/pytorch:24.01-py3", None, "nvcr.io/nvidia/pytorch:24.01-py3"),
    ("docker://127.0.0.1:5000#busybox:1", None, "127.0.0.1:5000/busybox:1"),
    ("docker://myreg#team/app", None, "myreg/team/app:latest"),  # '#': the registry as is
    ("docker://registry-1.docker.io#ubuntu:22.04", None, "docker.io/library/ubuntu:22.04"),
    ("docker://alice@nvcr.io#nvidia/cuda:12.4", "alice", "nvcr.io/nvidia/cuda:12.4"),
    ("docker://$oauthtoken@nvcr.io#nvidia/cuda", "$oauthtoken", "nvcr.io/nvidia/cuda:latest"),
    ("docker://bob@ghcr.io/org/tool:v1", "bob", "ghcr.io/org/tool:v1"),
    ("docker://nvidia/cuda:12.4", None, "docker.io/nvidia/cuda:12.4"),
    ("docker://reg.example:5000/a/b:t", None, "reg.example:5000/a/b:t"),
])
def test_enroot_uris(uri: str, user: str | None, expected: str) -> None:
    parsed = parse_enroot_uri(uri)
    assert (parsed.user, str(parsed.reference)) == (user, expected)


def test_enroot_uri_with_digest() -> None:
    digest = "sha256:" + "a" * 64
    parsed = parse_enroot_uri(f"docker://127.0.0.1:5000#busybox@{digest}")
    assert parsed.user is None
    assert str(parsed.reference.digest) == digest
    assert parsed.reference.registry == "127.0.0.1:5000"
    with_user = parse_enroot_uri(f"docker://u@reg.io#img:tag@{digest}")
    assert with_user.user == "u" and with_user.reference.tag == "tag"
    plain = parse_enroot_uri(f"docker://ubuntu@{digest}")
    assert plain.user is None and plain.reference.repository == "library/ubuntu"


@pytest.mark.parametrize("uri", ["docker://", "docker://reg#", "docker://#img",
                                 "docker://a#b#c", "docker://reg/x#img", "docker://re g#img",
                                 "docker://u s@reg#img", "docker://127.0.0.1:99999#lib/app:1",
                                 "docker://reg.io:0#app", "docker://127.0.0.1:65536/lib/app"])
def test_bad_enroot_uris(uri: str) -> None:
    with pytest.raises(InvalidReference):
        parse_enroot_uri(uri)


NETRC = """\
# enroot's credentials
machine nvcr.io login $oauthtoken password $NGC_KEY
machine nvcr.io login alice password alicepw
machine registry-1.docker.io login dockeruser password dockerpw
machine 127.0.0.1 login local password ${LOCAL_PW}
machine broken
"""


def test_netrc_entries_and_environment_passwords() -> None:
    entries = parse_netrc(NETRC, {"NGC_KEY": "secret", "LOCAL_PW": "pw2"}, "creds")
    assert [(e.machine, e.login, e.password) for e in entries] == [
        ("nvcr.io", "$oauthtoken", "secret"), ("nvcr.io", "alice", "alicepw"),
        ("registry-1.docker.io", "dockeruser", "dockerpw"), ("127.0.0.1", "local", "pw2")]


def test_netrc_commands_and_unset_variables_are_refused() -> None:
    with pytest.raises(PyxisImportError, match="runs a command"):
        parse_netrc("machine h login u password $(cat /etc/shadow)", {}, "creds")
    with pytest.raises(PyxisImportError, match="not set"):
        parse_netrc("machine h login u password $NOPE", {}, "creds")


def _home(tmp_path: Path, netrc: str | None = None, docker: dict[str, object] | None = None
          ) -> dict[str, str]:
    home = tmp_path / "home"
    (home / ".config" / "enroot").mkdir(parents=True)
    if netrc is not None:
        (home / ".config" / "enroot" / ".credentials").write_text(netrc)
    if docker is not None:
        (home / ".docker").mkdir()
        (home / ".docker" / "config.json").write_text(json.dumps(docker))
    return {"HOME": str(home), "NGC_KEY": "secret", "LOCAL_PW": "pw2"}


def test_credentials_user_from_uri_then_auth_files_then_netrc(tmp_path: Path) -> None:
    import base64

    docker = {"auths": {"nvcr.io": {"auth": base64.b64encode(b"fromdocker:dpw").decode()}}}
    env = _home(tmp_path, NETRC, docker)
    named = EnrootCredentials("alice", env).lookup("nvcr.io")
    assert named is not None and (named.username, named.password) == ("alice", "alicepw")
    anonymous = EnrootCredentials(None, env).lookup("nvcr.io")
    assert anonymous is not None and anonymous.username == "fromdocker"
    # docker.io: enroot's machine name for it; a port is not part of the machine
    hub = EnrootCredentials(None, env).lookup("docker.io", "library/ubuntu")
    assert hub is not None and (hub.username, hub.password) == ("dockeruser", "dockerpw")
    local = EnrootCredentials(None, env).lookup("127.0.0.1:5000")
    assert local is not None and local.password == "pw2"
    assert EnrootCredentials(None, env).lookup("other.example") is None


def test_credentials_from_enroot_config_path(tmp_path: Path) -> None:
    env = _home(tmp_path)
    elsewhere = tmp_path / "enrootconf"
    elsewhere.mkdir()
    (elsewhere / ".credentials").write_text("machine reg.io login me password pw\n")
    env["ENROOT_CONFIG_PATH"] = str(elsewhere)
    found = EnrootCredentials(None, env).lookup("reg.io:443")
    assert found is not None and found.username == "me"


def test_fifos_at_enroots_credentials_and_dockers_config_are_skipped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """enroot skips a .credentials that is no regular file (without a word); the importer
    did open it and wait for a writer forever, as it did on ~/.docker/config.json."""
    env = _home(tmp_path)
    home = Path(env["HOME"])
    (home / ".docker").mkdir()
    fifos = [home / ".config" / "enroot" / ".credentials", home / ".docker" / "config.json"]
    for fifo in fifos:
        os.mkfifo(fifo)
    with deadline(20), caplog.at_level("WARNING"):
        assert EnrootCredentials("alice", env).lookup("nvcr.io") is None
    assert [m.split(" is ")[0] for m in caplog.messages] == [str(fifos[1])]  # enroot's: silent
    assert f"{fifos[1]} is not a regular file" in caplog.text


def test_a_symlinked_netrc_is_skipped_with_a_warning(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    env = _home(tmp_path)
    real = tmp_path / "real-credentials"
    real.write_text("machine reg.io login me password pw\n")
    netrc = Path(env["HOME"]) / ".config" / "enroot" / ".credentials"
    netrc.symlink_to(real)
    with caplog.at_level("WARNING"):
        assert EnrootCredentials(None, env).lookup("reg.io") is None
    assert f"{netrc} is a symbolic link" in caplog.text


# -- enroot's rootfs files ---------------------------------------------------------------------

def test_enroot_files_of_a_full_config() -> None:
    config = {"config": {
        "Env": ["PATH=/usr/bin:/bin", "GREETING=hello world"],
        "WorkingDir": "/home/app",
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": ["echo it's here"],
        "Labels": {"b.label": "two\nlines", "a.label": "x"},
        "Volumes": {"/data": {}, "/cache": {}},
        "User": "app",
    }}
    files, workdir = enroot_files(config)
    assert workdir == "/home/app"
    assert files["etc/environment"] == b"PATH=/usr/bin:/bin\nGREETING=hello world\n"
    assert files["etc/fstab"] == (
        b"${ENROOT_ROOTFS}/cache /cache none x-create=dir,bind,rw,nosuid,nodev\n"
        b"${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n")
    rc = files["etc/rc"].decode()
    assert rc.startswith("# b.label two lines\n# a.label x\n\nmkdir -p \"/home/app\"")
    assert "    exec '/bin/sh' '-c' \"$@\"\n" in rc
    assert "    exec '/bin/sh' '-c' 'echo it'\\''s here'\n" in rc
    assert files["etc/rc.local"].startswith(b"# This file is sourced by /etc/rc")


def test_enroot_files_of_an_empty_config_run_a_shell() -> None:
    files, workdir = enroot_files({})
    assert workdir == "/"
    assert files["etc/environment"] == b"" and files["etc/fstab"] == b""
    rc = files["etc/rc"].decode()
    assert rc.startswith('mkdir -p "/" 2> /dev/null\ncd "/" && unset OLDPWD || exit 1\n')
    assert "    exec  '/bin/sh'\n" in rc and '    exec  "$@"\n' in rc


def test_rc_runs_as_enroot_runs_it(tmp_path: Path) -> None:
    """The generated /etc/rc, run by bash as enroot runs it, execs what the image says."""
    bash = require_binary("bash")
    config = {"config": {"Entrypoint": ["printf", "[%s]"], "Cmd": ["a b", "it's", "x\ty"],
                         "WorkingDir": str(tmp_path / "wd")}}
    rc = tmp_path / "rc"
    rc.write_bytes(enroot_files(config)[0]["etc/rc"])
    default = subprocess.run([bash, str(rc)], capture_output=True, text=True, check=True)
    assert default.stdout == "[a b][it's][x\ty]"
    given = subprocess.run([bash, str(rc), "one", "two"], capture_output=True, text=True,
                           check=True)
    assert given.stdout == "[one][two]"
    assert (tmp_path / "wd").is_dir()


@pytest.mark.parametrize(("config", "field"), [
    ({"Labels": {"a\nrm -rf /": "v"}}, "config.Labels key"),
    ({"Env": ["A=1", "B=2\nLD_PRELOAD=/tmp/x.so"]}, "config.Env[1]"),
    ({"Volumes": {"/data\n/home /home": {}}}, "config.Volumes path"),
    ({"Volumes": {"/data /x": {}}}, "config.Volumes path"),
    ({"Volumes": {"/data\t/x": {}}}, "config.Volumes path"),
    ({"Volumes": {"/../../../home": {}}}, "config.Volumes path"),
    ({"Volumes": {"data": {}}}, "config.Volumes path"),
    ({"Volumes": {"/${HOME}": {}}}, "config.Volumes path"),
    ({"Volumes": {"/a\\040b": {}}}, "config.Volumes path"),
    ({"WorkingDir": '/w"; touch /tmp/owned; "'}, "config.WorkingDir"),
    ({"WorkingDir": "/w$(id)"}, "config.WorkingDir"),
    ({"WorkingDir": "/w`id`"}, "config.WorkingDir"),
    ({"WorkingDir": "/w\\"}, "config.WorkingDir"),
    ({"WorkingDir": "/w\nid"}, "config.WorkingDir"),
    ({"WorkingDir": "-"}, "config.WorkingDir"),
    ({"WorkingDir": "/w\x00"}, "config.WorkingDir"),
    ({"Env": ["A=\ud800"]}, "config.Env[0]"),
    ({"Labels": {"k": "\x00"}}, "config.Labels['k']"),
    ({"Entrypoint": ["/bin/sh", "\udcff"]}, "config.Entrypoint[1]"),
    ({"Cmd": ["-c", "id"]}, "config.Cmd[0]"),
    ({"Entrypoint": ["-a", "name", "/bin/sh"]}, "config.Entrypoint[0]"),
])
def test_values_that_change_enroots_files_are_refused(config: dict[str, object],
                                                     field: str) -> None:
    """enroot writes these raw (a line more in rc, environment or fstab, a host path bind
    mounted, a command run by /etc/rc); the importer refuses them, naming image and field."""
    with pytest.raises(PyxisImportError) as info:
        enroot_files({"config": config}, "reg.io/hostile:1")
    assert info.value.message.startswith(f"image reg.io/hostile:1: {field} "), info.value.message
    assert info.value.hint and "docs/pyxis.md" in info.value.hint


def test_what_enroot_changes_itself_is_kept_as_enroot_writes_it() -> None:
    """A label value's newlines become spaces, an Entrypoint word with a newline is quoted,
    a Cmd word may start with '-' after the program: the structure stays, byte parity with
    enroot (docker.sh) where enroot's own output is well-formed."""
    files, _ = enroot_files({"config": {"Labels": {"k": "a\nb"},
                                        "Entrypoint": ["/bin/echo", "x\ny"], "Cmd": ["-n"],
                                        "WorkingDir": "/w d/#x"}})
    rc = files["etc/rc"].decode()
    assert rc.startswith('# k a b\n\nmkdir -p "/w d/#x" 2> /dev/null\n')
    assert "    exec '/bin/echo' $'x\\ny' '-n'\n" in rc


# -- hostile strings in every field: refused, or the files' structure unchanged ----------------

_HOSTILE_PIECES = [" ", "\t", "\n", "\r", "\v", "\f", "\x85", "\u2028", "\xa0", '"', "'", "`",
                   "$", "${HOME}", "$(id)", "\\", "#", ";", "&&", "|", "-", "--", "..", "/",
                   "\x00", "\ud800", "\udcff", "*", "!", "\x1b[0m", "=", ","]
_hostile = st.one_of(
    st.lists(st.sampled_from(_HOSTILE_PIECES) | st.text(max_size=3), max_size=8).map("".join),
    st.text(),
    st.text(st.characters(codec=None), min_size=1, max_size=20),
    st.just("x" * 4096), st.just("/" + "a" * 4095), st.just("-x"), st.just("/a\n/b c"),
)
#: the fields of the config, each with a benign value of its kind and where a value goes
_BENIGN = {
    "label key": "org.example.key", "label value": "value", "Env": "B=2",
    "Volumes": "/data", "WorkingDir": "/work", "Entrypoint": "/bin/prog",
    "Entrypoint arg": "arg", "Cmd": "/bin/prog", "Cmd arg": "arg",
}


def _config(field: str, value: str) -> dict[str, object]:
    config: dict[str, object] = {"Env": ["A=1"], "Volumes": {"/cache": {}},
                                 "Labels": {"a": "1"}, "WorkingDir": "/",
                                 "Entrypoint": ["/bin/entry"], "Cmd": ["c"]}
    if field == "label key":
        config["Labels"] = {"a": "1", value: "v"}
    elif field == "label value":
        config["Labels"] = {"a": "1", "b": value}
    elif field == "Env":
        config["Env"] = ["A=1", value]
    elif field == "Volumes":
        config["Volumes"] = {"/cache": {}, value: {}}
    elif field == "WorkingDir":
        config["WorkingDir"] = value
    elif field in ("Entrypoint", "Cmd"):
        config[field] = [value, "x"]
        if field == "Cmd":
            config["Entrypoint"] = []
    else:
        config[field.split()[0]] = ["/bin/prog", value]
    return {"config": config}


def _structure(files: dict[str, bytes]) -> dict[str, object]:
    """What must not depend on a value: lines of each file, fields per fstab line, the
    comment and exec lines of rc."""
    text = {path: data.decode() for path, data in files.items()}
    rc = text["etc/rc"].split("\n")
    return {
        "lines": {path: len(t.split("\n")) for path, t in text.items()},
        "fstab fields": [len(line.split()) for line in text["etc/fstab"].split("\n")],
        "fstab sources": [line.startswith("${ENROOT_ROOTFS}/")
                          for line in text["etc/fstab"].split("\n") if line],
        "rc comments": [n for n, line in enumerate(rc) if line.lstrip().startswith("#")],
        "rc exec": [n for n, line in enumerate(rc) if line.lstrip().startswith("exec")],
    }


@pytest.mark.parametrize("field", sorted(_BENIGN))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_hostile)
def test_hostile_values_are_refused_or_change_no_structure(field: str, value: str) -> None:
    bash = shutil.which("bash")
    assert bash is not None
    assume(field != "label key" or value != "a")  # the config's own label: one label, not two
    benign, _ = enroot_files(_config(field, _BENIGN[field]), "reg.io/x:1")
    try:
        files, workdir = enroot_files(_config(field, value), "reg.io/x:1")
    except PyxisImportError as error:
        assert error.message.startswith("image reg.io/x:1: config."), error.message
        return
    assert _structure(files) == _structure(benign), (field, value)
    checked = subprocess.run([bash, "-n"], input=files["etc/rc"], capture_output=True,
                             check=False)
    assert checked.returncode == 0, checked.stderr
    assert workdir == (value or "/" if field == "WorkingDir" else "/")


MKSQUASHFS_HELP = """\
-comp <comp>		select <comp> compression
			Compressors available:
				gzip (default)
				lzo
				xz
-b <block_size>		set data block size
Compressors available and compressor specific options:
	gzip (default)
"""


def test_compressors_listed() -> None:
    assert compressors_listed(MKSQUASHFS_HELP) == ["gzip", "lzo", "xz"]
    assert compressors_listed("nothing here") == []


def test_mksquashfs_argv_excludes_last_and_adds_missing_dirs(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "srv").write_text("a file")
    argv = mksquashfs_argv("mksquashfs", rootfs, tmp_path / "img",
                           {"etc/rc": tmp_path / "f0", "etc/deep/x": tmp_path / "f1"},
                           "/work/dir", DEFAULT_COMPRESSIONS[0], 2)
    assert argv[argv.index("-comp") + 1] == "zstd" and "-all-root" in argv
    assert argv[argv.index("-Xcompression-level") + 1] == "6"  # docs/pyxis.md: what an image costs
    pseudo = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
    assert pseudo_dir(["etc", "deep"], 0o755, 0, 0) in pseudo
    assert pseudo_dir(["work"], 0o755, 0, 0) in pseudo
    assert pseudo_dir(["work", "dir"], 0o755, 0, 0) in pseudo
    assert pseudo_dir(["etc"], 0o755, 0, 0) not in pseudo
    assert pseudo_file(["etc", "rc"], 0o644, 0, 0, f"cat {tmp_path / 'f0'}") in pseudo
    assert argv[argv.index("-e"):] == ["-e", "dev/*", "etc/deep/x", "etc/rc"]
    under_file = mksquashfs_argv("mksquashfs", rootfs, tmp_path / "img", {}, "/srv/x",
                                 Compression("gzip"), 1)
    assert not any(a.startswith("\\s\\r\\v") for a in under_file)


def test_mksquashfs_argv_builds_the_image(tmp_path: Path) -> None:
    require_binary("mksquashfs")
    require_binary("unsquashfs")
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "dev").mkdir()
    (rootfs / "dev" / "null").write_text("")
    (rootfs / "etc" / "environment").write_text("OLD=1\n")
    files, workdir = enroot_files({"config": {"Env": ["NEW=2"], "WorkingDir": "/w"}})
    written = {}
    for n, (inside, data) in enumerate(files.items()):
        written[inside] = tmp_path / f"f{n}"
        written[inside].write_bytes(data)
    image = tmp_path / "img.sqsh"
    subprocess.run(mksquashfs_argv(shutil.which("mksquashfs") or "", rootfs, image, written,
                                   workdir, Compression("gzip"), 1),
                   check=True, capture_output=True)
    listing = subprocess.run(["unsquashfs", "-lln", str(image)], capture_output=True,
                             text=True, check=True).stdout
    assert "squashfs-root/w\n" in listing and "squashfs-root/dev/null" not in listing
    assert " 0/0 " in listing and f" {os.getuid()}/" not in listing.replace(" 0/0 ", "")
    environment = subprocess.run(["unsquashfs", "-cat", str(image), "etc/environment"],
                                 capture_output=True, check=True).stdout
    assert environment == b"NEW=2\n"


# -- the store: leases, one build --------------------------------------------------------------

def test_job_steps() -> None:
    step = JobStep.from_environment({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3"})
    assert step.prefix == "pyxis-42.3-" and step.holder().kind == "slurm-job"
    outside = JobStep.from_environment({})
    assert outside.prefix == "pyxis-nojob.none-" and outside.holder().kind == "pin"
    odd = JobStep.from_environment({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "../x"})
    assert odd.step_id == "none"


def _provide(store: Store, key: str, step: JobStep,
             make: Callable[[], object]) -> tuple[Path, bool]:
    """Image ``key`` as the importer's get asks for it: built by ``make`` if it is missing."""
    with ImageStore(store.root).building(key, step) as slot:
        if slot.missing:
            make()
    return slot.path, slot.missing


def _fake_build(store: Store, key: str, counter: Path) -> None:
    with counter.open("a") as out:
        out.write("build\n")
    time.sleep(0.5)
    scratch = store.temp_dir("pyxis")
    image = scratch / "img"
    image.write_bytes(b"squashfs " + key.encode())
    ImageStore(store.root).publish(image, key, {"test": True})
    store.remove_temp_dir(scratch)


def _ask(root: str, key: str, job: str, counter: str, results: str) -> None:
    store = Store.open(root)
    step = JobStep(job, "0")
    path, built = _provide(store, key, step,
                          lambda: _fake_build(store, key, Path(counter)))
    with open(results, "a") as out:
        out.write(f"{path} {built}\n")


def test_many_processes_asking_at_once_build_once(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    key = image_key("sha256:" + "b" * 64, "zstd")
    counter, results = tmp_path / "builds", tmp_path / "results"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_ask, args=(str(store.root), key, str(100 + n),
                                                  str(counter), str(results)))
               for n in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert counter.read_text() == "build\n"
    lines = results.read_text().splitlines()
    assert sorted(line.split()[1] for line in lines) == ["False", "False", "False", "True"]
    assert {line.split()[0] for line in lines} == {str(ImageStore(store.root).path(key))}
    assert ImageStore(store.root).path(key).read_bytes() == b"squashfs " + key.encode()
    record = ImageStore(store.root).path(key).with_suffix(".json")
    assert json.loads(record.read_text()) == {"test": True}
    held = leases.leases_on(store.root, f"squashfs:{key}")
    assert sorted(lease.holder.job_id or "" for lease in held) == ["100", "101", "102", "103"]
    assert not list((store.root / "tmp").iterdir())


def test_a_failed_build_leaves_nothing_and_the_next_builds(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    key = image_key("sha256:" + "c" * 64, "gzip")
    step = JobStep("5", "0")

    def failing() -> None:
        scratch = store.temp_dir("pyxis")
        (scratch / "half").write_bytes(b"half an image")
        store.remove_temp_dir(scratch)
        raise PyxisImportError("mksquashfs failed: No space left on device")

    with pytest.raises(PyxisImportError):
        _provide(store, key, step, failing)
    assert not ImageStore(store.root).path(key).exists()
    assert [p.name for p in (store.root / "pyxis").iterdir()] == []  # no lock, no image
    path, built = _provide(store, key, step,
                          lambda: _fake_build(store, key, tmp_path / "count"))
    assert built and path.is_file()


def test_a_failed_get_drops_the_leases_it_made_and_no_earlier_one(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    made, earlier = (image_key("sha256:" + c * 64, "zstd") for c in "ef")
    JobStep("3", "0").hold(store.root, earlier)  # an earlier get of the step
    step = JobStep("3", "0")
    step.hold(store.root, earlier)
    step.hold(store.root, made)
    step.drop_taken()
    assert [lease.target for lease in leases.all_leases(store.root)] == [f"squashfs:{earlier}"]


def test_release_is_idempotent_and_only_the_steps(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    key = image_key("sha256:" + "d" * 64, "zstd")
    counter = tmp_path / "count"
    for job, step_id in (("9", "0"), ("9", "1"), ("10", "0")):
        _provide(store, key, JobStep(job, step_id),
                                  lambda: _fake_build(store, key, counter))
    assert JobStep("9", "0").release([store.root]) == 1
    assert JobStep("9", "0").release([store.root]) == 0
    assert JobStep("9", "0").release([tmp_path / "absent"]) == 0
    left = sorted(lease.id for lease in leases.all_leases(store.root))
    assert [lease_id.split("-")[1] for lease_id in left] == ["10.0", "9.1"]


def test_recall_needs_the_image(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    reference = parse_enroot_uri("docker://reg.io#img:1").reference
    key = image_key("sha256:" + "e" * 64, "zstd")
    ImageStore(store.root).remember(reference, key, "sha256:" + "e" * 64)
    assert recall(store.root, reference) is None  # no image at the key
    _provide(store, key, JobStep("1", "0"),
                              lambda: _fake_build(store, key, tmp_path / "n"))
    assert recall(store.root, reference) == (key, "sha256:" + "e" * 64)
    other = parse_enroot_uri("docker://reg.io#img:2").reference
    assert recall(store.root, other) is None


def test_cli_errors_are_one_error_and_hint_line(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setenv("OCISTAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SLURM_JOB_ID", "3")
    for uri in ("docker://reg#", "docker://127.0.0.1:99999#lib/app:1"):
        assert run(["get", uri]) == 2  # InvalidReference: a usage error
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: ") and "\nhint: " in err, err
        assert len(err.splitlines()) == 2 and "internal error" not in err
    assert run(["frobnicate"]) == 2
    assert run(["release"]) == 0 and run(["release"]) == 0
    out, err = capsys.readouterr()
    assert out == ""


def test_mksquashfs_errors_say_when_the_store_is_full(tmp_path: Path) -> None:
    full = mksquashfs_error("Write failed because No space left on device\n"
                            "FATAL ERROR: Failed to write to output filesystem\n", 1, tmp_path)
    assert "no space left" in full.message and str(tmp_path) in full.message
    assert full.hint is not None and "pyxis_store" in full.hint
    other = mksquashfs_error("FATAL ERROR: Source directory is not a directory\n", 1, tmp_path)
    assert other.message == "mksquashfs failed: FATAL ERROR: Source directory is not a directory"
    assert mksquashfs_error("", 139, tmp_path).message == "mksquashfs failed: exit 139"


def test_a_failed_mksquashfs_is_its_error_not_what_it_printed_after(tmp_path: Path) -> None:
    """mksquashfs writes its error to stderr at once and its other output, buffered, to
    stdout at exit: the importer's error is the FATAL ERROR line, not the last line read."""
    script = ("echo 'FATAL ERROR: Source directory is not a directory' >&2; "
              "for n in 1 2 3 4 5 6 7 8 9 10; do echo \"line $n\"; done; exit 1")
    with pytest.raises(PyxisImportError) as caught:
        run_mksquashfs(["/bin/sh", "-c", script], tmp_path)
    assert caught.value.message == \
        "mksquashfs failed: FATAL ERROR: Source directory is not a directory"


def test_hints_name_settings_not_options() -> None:
    from ocistage.bundler.registry.errors import RateLimited, RegistryUnreachable

    for error in (RegistryUnreachable("x"), RateLimited("x")):
        assert error.hint is not None and "--" in error.hint
        assert "--" not in (VOICE.hint(error.hint) or ""), error.hint


@pytest.mark.parametrize("uri", [
    "docker://127.0.0.1:5000#UPPER/x:1", "docker://myreg.example#team/app:bad:tag",
    "docker://myreg.example#team/app@sha256:zz", "docker://myreg.example#-x",
    "docker://alice@nvcr.io#nvidia/cuda:", "docker://nvcr.io#nvidia/cuda@"])
def test_errors_name_the_uri_the_user_typed(uri: str) -> None:
    """Issue 38: the image part of REGISTRY#IMAGE is parsed behind a stand-in registry, and
    its errors named that ('localhost/...') instead of what pyxis was given."""
    with pytest.raises(InvalidReference) as caught:
        parse_enroot_uri(uri)
    assert repr(uri) in caught.value.message and "localhost" not in caught.value.message


def test_the_importer_reaches_leases_only_through_cache_leases() -> None:
    """Issue 36: the importer read ``STORE/leases`` itself to release a step's leases; its
    leases are taken and dropped by ocistage.cache.leases alone."""
    package = Path(__file__).resolve().parents[2] / "bundler" / "pyxis"
    for module in sorted(package.glob("*.py")):
        text = module.read_text()
        assert '"leases"' not in text and "'leases'" not in text, module.name
        assert "scandir" not in text, module.name
