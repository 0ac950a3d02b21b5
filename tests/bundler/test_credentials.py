"""Credentials from auth files and real credential-helper programs."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from ocistage.bundler.registry.credentials import Credentials, CredentialStore, normalize_key
from ocistage.bundler.registry.errors import AuthenticationError
from tests.cotenant import NOBODY, as_nobody, second_user, sticky_directory
from tests.deadline import deadline


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _write(path: Path, document: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def helper_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real ``docker-credential-test`` on PATH; it logs the server URL it was asked for."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "docker-credential-test"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = get ] || exit 3\n'
        "read -r server\n"
        f'echo "$server" >> "{bindir}/asked"\n'
        'case "$server" in\n'
        '  helper.example) echo \'{"ServerURL":"helper.example",'
        '"Username":"hu","Secret":"hs"}\';;\n'
        '  https://index.docker.io/v1/) echo \'{"Username":"hubuser","Secret":"hubpass"}\';;\n'
        '  token.example) echo \'{"Username":"<token>","Secret":"refresh-me"}\';;\n'
        '  garbage.example) echo \'not json\';;\n'
        '  *) echo "credentials not found in native keychain"; exit 1;;\n'
        "esac\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return bindir


def test_auth_field_and_username_password(tmp_path: Path) -> None:
    path = _write(tmp_path / "auth.json", {"auths": {
        "reg.example:5000": {"auth": _b64("alice:s3cr:et")},
        "other.example": {"username": "bob", "password": "pw"},
    }})
    store = CredentialStore([path])
    assert store.lookup("reg.example:5000") == Credentials("alice", "s3cr:et")
    assert store.lookup("other.example", "some/repo") == Credentials("bob", "pw")
    assert store.lookup("reg.example") is None  # the port is part of the key


def test_key_forms_are_normalized(tmp_path: Path) -> None:
    path = _write(tmp_path / "config.json", {"auths": {
        "https://index.docker.io/v1/": {"auth": _b64("hub:pw")},
        "http://plain.example/": {"auth": _b64("p:q")},
        "https://v2.example/v2/": {"auth": _b64("v:w")},
    }})
    store = CredentialStore([path])
    assert store.lookup("docker.io", "library/alpine") == Credentials("hub", "pw")
    assert store.lookup("plain.example") == Credentials("p", "q")
    assert store.lookup("v2.example") == Credentials("v", "w")
    assert normalize_key("https://index.docker.io/v1/") == "index.docker.io"
    assert normalize_key("host/ns/repo/") == "host/ns/repo"


def test_most_specific_repository_key_wins(tmp_path: Path) -> None:
    path = _write(tmp_path / "auth.json", {"auths": {
        "quay.example": {"auth": _b64("generic:1")},
        "quay.example/team": {"auth": _b64("team:2")},
        "quay.example/team/app": {"auth": _b64("app:3")},
    }})
    store = CredentialStore([path])
    assert store.lookup("quay.example", "team/app") == Credentials("app", "3")
    assert store.lookup("quay.example", "team/app/sub") == Credentials("app", "3")
    assert store.lookup("quay.example", "team/other") == Credentials("team", "2")
    assert store.lookup("quay.example", "elsewhere/x") == Credentials("generic", "1")
    assert store.lookup("quay.example") == Credentials("generic", "1")


def test_identity_token_entry(tmp_path: Path) -> None:
    path = _write(tmp_path / "config.json", {"auths": {
        "idp.example": {"auth": _b64("user:"), "identitytoken": "refresh-xyz"},
    }})
    found = CredentialStore([path]).lookup("idp.example")
    assert found is not None
    assert found.identity_token == "refresh-xyz"
    assert found.username == "user"


def test_environment_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    runtime = tmp_path / "run"
    docker_cfg = tmp_path / "dockercfg"
    explicit = _write(tmp_path / "explicit.json", {"auths": {"a.example": {"auth": _b64("x:1")}}})
    _write(runtime / "containers" / "auth.json", {"auths": {
        "a.example": {"auth": _b64("x:2")}, "b.example": {"auth": _b64("y:2")}}})
    _write(home / ".config" / "containers" / "auth.json", {"auths": {
        "b.example": {"auth": _b64("y:3")}, "c.example": {"auth": _b64("z:3")}}})
    _write(docker_cfg / "config.json", {"auths": {
        "c.example": {"auth": _b64("z:4")}, "d.example": {"auth": _b64("w:4")}}})
    _write(home / ".docker" / "config.json", {"auths": {"e.example": {"auth": _b64("v:5")}}})
    env = {"REGISTRY_AUTH_FILE": str(explicit), "XDG_RUNTIME_DIR": str(runtime),
           "DOCKER_CONFIG": str(docker_cfg), "HOME": str(home)}
    store = CredentialStore.from_environment(env)
    assert store.lookup("a.example") == Credentials("x", "1")
    assert store.lookup("b.example") == Credentials("y", "2")
    assert store.lookup("c.example") == Credentials("z", "3")
    assert store.lookup("d.example") == Credentials("w", "4")
    assert store.lookup("e.example") is None  # ~/.docker is replaced by $DOCKER_CONFIG
    without = CredentialStore.from_environment({"HOME": str(home)})
    assert without.lookup("e.example") == Credentials("v", "5")
    assert without.files[-1] == home / ".docker" / "config.json"


def test_missing_files_mean_no_credentials(tmp_path: Path) -> None:
    store = CredentialStore.from_environment({"HOME": str(tmp_path)})
    assert store.lookup("docker.io", "library/alpine") is None


def test_malformed_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    path.write_text("{not json")
    with pytest.raises(AuthenticationError, match=str(path)):
        CredentialStore([path]).lookup("x.example")
    _write(path, {"auths": {"x.example": {"auth": "!!!not-base64"}}})
    with pytest.raises(AuthenticationError, match="base64"):
        CredentialStore([path]).lookup("x.example")


def test_cred_helpers_per_host(tmp_path: Path, helper_dir: Path) -> None:
    path = _write(tmp_path / "config.json", {
        "credHelpers": {"helper.example": "test", "docker.io": "test", "token.example": "test"},
        "auths": {"helper.example": {"auth": _b64("file:ignored")}},
    })
    store = CredentialStore([path])
    assert store.lookup("helper.example") == Credentials("hu", "hs")
    assert store.lookup("docker.io", "library/alpine") == Credentials("hubuser", "hubpass")
    token = store.lookup("token.example")
    assert token is not None and token.identity_token == "refresh-me"
    assert (helper_dir / "asked").read_text().splitlines() == [
        "helper.example", "https://index.docker.io/v1/", "token.example"]


def test_creds_store_is_the_default(tmp_path: Path, helper_dir: Path) -> None:
    path = _write(tmp_path / "config.json", {
        "credsStore": "test", "auths": {"file.example": {"auth": _b64("f:g")}}})
    store = CredentialStore([path])
    assert store.lookup("file.example") == Credentials("f", "g")
    assert store.lookup("helper.example") == Credentials("hu", "hs")
    assert store.lookup("unknown.example") is None  # helper exits 1: no credentials
    assert store.lookup("garbage.example") is None  # unreadable answer: no credentials


def test_missing_helper_is_not_a_crash(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path / "config.json", {"credsStore": "does-not-exist-anywhere"})
    with caplog.at_level("DEBUG", logger="ocistage.bundler.registry.credentials"):
        assert CredentialStore([path]).lookup("reg.example") is None
    assert "docker-credential-does-not-exist-anywhere" in caplog.text


def test_password_not_in_repr() -> None:
    assert "hunter2" not in repr(Credentials("alice", "hunter2", "tok"))


# -- files others could plant: FIFOs, symlinks, another user's files and directories ------------

def test_fifos_in_place_of_auth_files_are_skipped_not_waited_for(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    home, runtime = tmp_path / "home", tmp_path / "run"
    fifos = [tmp_path / "explicit.json", runtime / "containers" / "auth.json",
             home / ".config" / "containers" / "auth.json", home / ".docker" / "config.json"]
    for fifo in fifos:
        fifo.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(fifo)
    env = {"REGISTRY_AUTH_FILE": str(fifos[0]), "XDG_RUNTIME_DIR": str(runtime),
           "HOME": str(home)}
    with deadline(20), caplog.at_level("WARNING"):
        assert CredentialStore.from_environment(env).lookup("reg.example") is None
    for fifo in fifos:
        assert f"{fifo} is not a regular file" in caplog.text


def test_a_symlinked_auth_file_is_skipped_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = _write(tmp_path / "elsewhere.json", {"auths": {"r.example": {"auth": _b64("a:b")}}})
    link = tmp_path / "config.json"
    link.symlink_to(target)
    with caplog.at_level("WARNING"):
        assert CredentialStore([link]).lookup("r.example") is None
    assert f"{link} is a symbolic link" in caplog.text
    assert CredentialStore([target]).lookup("r.example") == Credentials("a", "b")


@second_user
def test_another_users_auth_file_is_not_used(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path / "config.json", {"auths": {"r.example": {"auth": _b64("n:pw")}}})
    os.chown(path, NOBODY, NOBODY)
    with caplog.at_level("WARNING"):
        assert CredentialStore([path]).lookup("r.example") is None
    assert f"owned by uid {NOBODY}" in caplog.text


@second_user
def test_a_runtime_dir_made_by_another_user_after_the_check_is_not_used(
        caplog: pytest.LogCaptureFixture) -> None:
    """As root with a job's XDG_RUNTIME_DIR that does not exist yet: a co-tenant who makes it
    (with an auth.json of theirs, or one root's own file linked in) between the moment the
    environment is read and the lookup does not get their credentials used."""
    with sticky_directory("ocistage-xdg-") as shared:
        runtime = shared / "run-1000"
        store = CredentialStore.from_environment({"XDG_RUNTIME_DIR": str(runtime),
                                                  "HOME": str(shared / "nohome")})
        document = json.dumps({"auths": {"r.example": {"auth": _b64("cotenant:pw")}}})
        as_nobody("sh", "-c", 'umask 077; mkdir -p "$1/containers" && printf %s "$2" '
                  '> "$1/containers/auth.json"', "sh", str(runtime), document)
        with caplog.at_level("WARNING"):
            assert store.lookup("r.example") is None
        assert f"{runtime} is owned by uid {NOBODY}" in caplog.text
        # the directory theirs, the file root's (a hard link they could not make, but made
        # here): the directory alone is reason enough
        planted = runtime / "containers" / "auth.json"
        planted.unlink()
        _write(planted, json.loads(document))
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert store.lookup("r.example") is None
        assert f"{runtime} is owned by uid {NOBODY}" in caplog.text


def test_a_runtime_dir_writable_by_others_is_not_used(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    _write(runtime / "containers" / "auth.json", {"auths": {"r.example": {"auth": _b64("a:b")}}})
    env = {"XDG_RUNTIME_DIR": str(runtime), "HOME": str(tmp_path / "home")}
    assert CredentialStore.from_environment(env).lookup("r.example") == Credentials("a", "b")
    (runtime / "containers").chmod(0o777)
    assert CredentialStore.from_environment(env).lookup("r.example") is None


@pytest.mark.parametrize("name", ["../../tmp/x", "/bin/sh", "a b", "-x", "", ".hidden", "x\ny"])
def test_a_helper_name_that_is_not_a_plain_name_is_never_run(
        tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a helper of exactly that name on PATH, which leaves a mark if anything runs it
    mark = tmp_path / "ran"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    trap = bin_dir / f"docker-credential-{name.replace('/', '_')}"
    trap.write_text(f"#!/bin/sh\ntouch {mark}\n")
    trap.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path / "config.json", {"credsStore": name})
    with caplog.at_level("WARNING", logger="ocistage.bundler.registry.credentials"):
        assert CredentialStore([path]).lookup("reg.example") is None
    assert not mark.exists()
    if name:
        assert "is not a plain name" in caplog.text
