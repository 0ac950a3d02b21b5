"""Image trust against the oracle: Debian's skopeo 1.9.3 signs the images (``copy --sign-by``,
``standalone-sign``, throwaway GNUPGHOME, a private ``file://`` lookaside) and decides, with
``skopeo copy --policy P --registries.d D``, on the same (policy, image) pairs as
``ocistage pull --policy P --registries.d D``: every verdict must be the same.

Nothing is written outside the test's directories: the policies, registries.d, keys and
signatures are private; the registry is the plugin's on 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_ocistage.components import Registry, require_binary
from pytest_ocistage.images import ImageRef, host_architecture
from pytest_ocistage.runner import OcistageRunner
from tests.bundler.trust.gpgkeys import Signer, signer, socket_dirs_cleaned

pytestmark = pytest.mark.e2e


@dataclass
class World:
    """The signed images, keys and configuration every case uses."""

    directory: Path
    registry: Registry
    gpg: Signer
    good: str  # fingerprints
    other: str
    good_key: Path
    good_key_armored: Path
    other_key: Path
    lookaside: Path
    registries_d: Path
    namespace: str
    digests: dict[str, str] = field(default_factory=dict)
    layout: str = ""  # an OCI layout "DIR:TAG" (the oci: transport's cases)
    http: str = ""  # the lookaside served over HTTP on 127.0.0.1

    def ref(self, name: str) -> str:
        return f"{self.registry.host}/{self.namespace}/{name}"

    def skopeo(self, *args: str, gpg: bool = False) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(self.directory)}
        if gpg:
            env["GNUPGHOME"] = str(self.gpg.home)
        return subprocess.run(["skopeo", *args], capture_output=True, text=True, env=env,
                              timeout=300, check=False)

    def copy(self, source: str, dest: str, *extra: str) -> None:
        done = self.skopeo("copy", "--quiet", f"--registries.d={self.registries_d}",
                           "--policy", str(self.accept_policy), *extra,
                           *self.registry.skopeo_flags("src-"),
                           *self.registry.skopeo_flags("dest-"),
                           f"docker://{source}", f"docker://{dest}", gpg=True)
        assert done.returncode == 0, done.stderr

    @property
    def accept_policy(self) -> Path:
        path = self.directory / "accept.json"
        path.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        return path

    def manifest(self, ref: str, raw_digest: str | None = None) -> bytes:
        target = ref if raw_digest is None else f"{ref.rsplit(':', 1)[0]}@{raw_digest}"
        done = subprocess.run(["skopeo", "inspect", "--raw",
                               *self.registry.skopeo_flags(), f"docker://{target}"],
                              capture_output=True, check=True, timeout=120)
        return done.stdout

    def standalone_sign(self, manifest: bytes, identity: str, fingerprint: str) -> bytes:
        path = self.directory / f"m-{uuid.uuid4().hex}"
        path.write_bytes(manifest)
        out = path.with_suffix(".sig")
        done = self.skopeo("standalone-sign", str(path), identity, fingerprint,
                           f"--output={out}", gpg=True)
        assert done.returncode == 0, done.stderr
        return out.read_bytes()

    def put_signatures(self, name: str, digest: str, signatures: list[bytes]) -> None:
        repo = f"{self.namespace}/{name.split(':')[0].split('@')[0]}"
        where = self.lookaside / f"{repo}@{digest.replace(':', '=')}"
        where.mkdir(parents=True, exist_ok=True)
        for old in where.glob("signature-*"):
            old.unlink()
        for n, signature in enumerate(signatures, start=1):
            (where / f"signature-{n}").write_bytes(signature)

    def signatures(self, name: str, digest: str) -> list[bytes]:
        repo = f"{self.namespace}/{name.split(':')[0]}"
        where = self.lookaside / f"{repo}@{digest.replace(':', '=')}"
        return [p.read_bytes() for p in sorted(where.glob("signature-*"))]


@contextmanager
def _served(directory: Path) -> Iterator[str]:
    """``directory`` over plain HTTP on 127.0.0.1 (a lookaside web server); its URL."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _digest(manifest: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(manifest).hexdigest()


@pytest.fixture(scope="module")
def world(images: dict[str, ImageRef], tmp_path_factory: pytest.TempPathFactory,
          plain_registry: Registry) -> Iterator[World]:
    require_binary("skopeo")
    require_binary("gpg")
    require_binary("gpgv")
    directory = tmp_path_factory.mktemp("trust-oracle")
    lookaside = directory / "lookaside"
    lookaside.mkdir()
    registries_d = directory / "registries.d"
    registries_d.mkdir()
    (registries_d / "default.yaml").write_text(
        f"default-docker:\n  lookaside: file://{lookaside}\n"
        f"  lookaside-staging: file://{lookaside}\n")
    with socket_dirs_cleaned(), signer() as gpg:
        good = gpg.new_key("Site signer <signer@site.example>")
        other = gpg.new_key("Someone else <else@example>")
        subkeyed = gpg.new_key("Signs with a subkey <sub@example>")
        gpg.gpg("--quick-add-key", subkeyed, "ed25519", "sign")
        keys = directory / "keys"
        keys.mkdir()
        (keys / "good.gpg").write_bytes(gpg.export(good))
        (keys / "good.asc").write_bytes(gpg.export(good, armor=True))
        (keys / "other.gpg").write_bytes(gpg.export(other))
        (keys / "subkeyed.gpg").write_bytes(gpg.export(subkeyed))
        w = World(directory, plain_registry, gpg, good, other, keys / "good.gpg",
                  keys / "good.asc", keys / "other.gpg", lookaside, registries_d,
                  f"trust{uuid.uuid4().hex[:8]}")
        busybox, multilayer, multiarch = (images["busybox"].ref, images["multilayer"].ref,
                                          images["multiarch"].ref)
        w.layout = f"{images['busybox'].layout.resolve()}:{images['busybox'].layout_tag}"
        # signed by skopeo copy --sign-by: the site's key, and another key
        w.copy(busybox, w.ref("signed:1"), f"--sign-by={good}")
        w.copy(busybox, w.ref("byother:1"), f"--sign-by={other}")
        w.copy(busybox, w.ref("unsigned:1"))
        w.copy(multiarch, w.ref("multi:1"), "--all", f"--sign-by={good}")
        w.copy(multiarch, w.ref("multi-index-only:1"), "--all")
        w.copy(multilayer, w.ref("otherdigest:1"))
        w.copy(busybox, w.ref("alias:1"))
        w.copy(busybox, w.ref("signed:2"))  # same digest, other tag: the same signatures
        w.copy(busybox, w.ref("two:1"))
        w.copy(busybox, w.ref("bysubkey:1"), f"--sign-by={subkeyed}")
        for name in ("signed:1", "unsigned:1", "otherdigest:1", "multi:1",
                     "multi-index-only:1"):
            w.digests[name] = _digest(w.manifest(w.ref(name)))
        signed = w.digests["signed:1"]
        assert w.signatures("signed", signed), "skopeo wrote no signature to the lookaside"
        # crafted with skopeo standalone-sign: a signature of another digest; signed:1's
        # identity on alias's (same) digest; two signatures, the other key's first
        w.put_signatures("otherdigest", w.digests["otherdigest:1"], w.signatures("signed",
                                                                                   signed))
        w.put_signatures("alias", signed, w.signatures("signed", signed))
        manifest = w.manifest(w.ref("signed:1"))
        w.put_signatures("two", signed, [
            w.standalone_sign(manifest, w.ref("two:1"), other),
            w.standalone_sign(manifest, w.ref("two:1"), good)])
        index = w.manifest(w.ref("multi-index-only:1"))
        w.put_signatures("multi-index-only", _digest(index), [
            w.standalone_sign(index, w.ref("multi-index-only:1"), good)])
        with _served(lookaside) as url:
            w.http = url
            yield w


def trust_files(world: World, directory: Path) -> tuple[Path, Path]:
    """In ``directory`` (made): a copy of the lookaside, the site's key, a registries.d that
    names that copy, and a policy that rejects everything but the world's namespace signed by
    that key; (the policy file, the registries.d directory)."""
    shutil.copytree(world.lookaside, directory / "lookaside")
    shutil.copy(world.good_key, directory / "good.gpg")
    (directory / "registries.d").mkdir()
    (directory / "registries.d" / "site.yaml").write_text(
        f"default-docker:\n  lookaside: file://{directory / 'lookaside'}\n")
    repo = f"{world.registry.host}/{world.namespace}"
    (directory / "policy.json").write_text(json.dumps({
        "default": [REJECT], "transports": {"docker": {repo: [
            signed_by(world, keyPath=str(directory / "good.gpg"))]}}}))
    return directory / "policy.json", directory / "registries.d"


def signed_by(world: World, identity: dict[str, str] | None = None,
              **keys: Any) -> dict[str, Any]:
    requirement: dict[str, Any] = {"type": "signedBy", "keyType": "GPGKeys"}
    requirement.update(keys or {"keyPath": str(world.good_key)})
    if identity is not None:
        requirement["signedIdentity"] = identity
    return requirement


REJECT = {"type": "reject"}
ACCEPT = {"type": "insecureAcceptAnything"}


def policy_for(world: World, case: str) -> tuple[Any, str, str | None]:
    """(policy document or raw text, image name, registries.d override) of each case."""
    host, ns = world.registry.host, world.namespace
    only = {"default": [REJECT]}

    def scoped(scope: str, requirement: dict[str, Any], default: Any = REJECT) -> Any:
        return {"default": [default], "transports": {"docker": {scope: [requirement]}}}

    repo = f"{host}/{ns}"
    table: dict[str, tuple[Any, str, str | None]] = {
        "right key": (scoped(repo, signed_by(world)), "signed:1", None),
        "right key, armored keyPath": (
            scoped(repo, signed_by(world, keyPath=str(world.good_key_armored))), "signed:1",
            None),
        "wrong key": (scoped(repo, signed_by(world)), "byother:1", None),
        "no signature": (scoped(repo, signed_by(world)), "unsigned:1", None),
        "two signatures, one good": (scoped(repo, signed_by(world)), "two:1", None),
        "signature of another digest": (scoped(repo, signed_by(world)), "otherdigest:1",
                                        None),
        "keyPaths, the right one second": (
            scoped(repo, signed_by(world, keyPaths=[str(world.other_key),
                                                    str(world.good_key)])), "signed:1", None),
        "keyPaths, only the other key": (
            scoped(repo, signed_by(world, keyPaths=[str(world.other_key)])), "signed:1",
            None),
        "keyData": (scoped(repo, signed_by(world, keyData=base64.b64encode(
            world.good_key.read_bytes()).decode())), "signed:1", None),
        "matchRepoDigestOrExact, other tag": (scoped(repo, signed_by(world)), "signed:2",
                                              None),
        "matchRepoDigestOrExact, by digest": (
            scoped(repo, signed_by(world)), f"signed@{world.digests['signed:1']}", None),
        "matchExact, by digest": (
            scoped(repo, signed_by(world, {"type": "matchExact"})),
            f"signed@{world.digests['signed:1']}", None),
        "matchExact, same tag": (scoped(repo, signed_by(world, {"type": "matchExact"})),
                                 "signed:1", None),
        "matchRepository, other tag": (
            scoped(repo, signed_by(world, {"type": "matchRepository"})), "signed:2", None),
        "matchRepository, other repository": (
            scoped(repo, signed_by(world, {"type": "matchRepository"})), "alias:1", None),
        "identity mismatch (default)": (scoped(repo, signed_by(world)), "alias:1", None),
        "exactReference": (scoped(repo, signed_by(world, {
            "type": "exactReference", "dockerReference": world.ref("signed:1")})),
            "alias:1", None),
        "exactReference, other tag": (scoped(repo, signed_by(world, {
            "type": "exactReference", "dockerReference": world.ref("signed:9")})),
            "alias:1", None),
        "exactRepository": (scoped(repo, signed_by(world, {
            "type": "exactRepository", "dockerRepository": world.ref("signed")})),
            "alias:1", None),
        "exactRepository, other": (scoped(repo, signed_by(world, {
            "type": "exactRepository", "dockerRepository": world.ref("nothing")})),
            "alias:1", None),
        "remapIdentity": (scoped(repo, signed_by(world, {
            "type": "remapIdentity", "prefix": world.ref("alias"),
            "signedPrefix": world.ref("signed")})), "alias:1", None),
        "remapIdentity, no prefix match": (scoped(repo, signed_by(world, {
            "type": "remapIdentity", "prefix": world.ref("elsewhere"),
            "signedPrefix": world.ref("signed")})), "alias:1", None),
        "precedence: repository reject over namespace signedBy": (
            {"default": [ACCEPT], "transports": {"docker": {
                repo: [signed_by(world)], f"{repo}/signed": [REJECT]}}}, "signed:1", None),
        "precedence: tag accept over repository reject": (
            {"default": [REJECT], "transports": {"docker": {
                f"{repo}/unsigned": [REJECT], f"{repo}/unsigned:1": [ACCEPT]}}},
            "unsigned:1", None),
        "precedence: host signedBy over default accept": (
            scoped(host, signed_by(world), ACCEPT), "unsigned:1", None),
        "precedence: wildcard": (
            {"default": [ACCEPT], "transports": {"docker": {"*.0.1": [REJECT]}}},
            "unsigned:1", None),
        "precedence: transport default scope": (
            {"default": [ACCEPT], "transports": {"docker": {"": [REJECT]}}}, "unsigned:1",
            None),
        "reject default": (only, "signed:1", None),
        "insecureAcceptAnything": ({"default": [ACCEPT]}, "unsigned:1", None),
        "all requirements must hold": (
            {"default": [ACCEPT], "transports": {"docker": {repo: [
                signed_by(world), REJECT]}}}, "signed:1", None),
        "multi-arch index, every manifest signed": (scoped(repo, signed_by(world)),
                                                    "multi:1", None),
        "multi-arch, only the index signed": (scoped(repo, signed_by(world)),
                                              "multi-index-only:1", None),
        "signed by a signing subkey of the policy's key": (
            scoped(repo, signed_by(world, keyPath=str(world.directory / "keys/subkeyed.gpg"))),
            "bysubkey:1", None),
        "oci: scope reject": (
            {"default": [ACCEPT], "transports": {"oci": {
                world.layout.rsplit(":", 1)[0]: [REJECT]}}}, "oci:", None),
        "oci: scope accept over default reject": (
            {"default": [REJECT], "transports": {"oci": {
                world.layout.rsplit(":", 1)[0]: [ACCEPT]}}}, "oci:", None),
        "oci: a DIR:TAG scope never matches (the tag is no part of the identity)": (
            {"default": [REJECT], "transports": {"oci": {world.layout: [ACCEPT]}}}, "oci:",
            None),
        "oci: the parent directory's scope": (
            {"default": [ACCEPT], "transports": {"oci": {
                world.layout.rsplit(":", 1)[0].rsplit("/", 1)[0]: [REJECT]}}}, "oci:", None),
        "oci: signedBy (no signatures in a layout)": (
            {"default": [signed_by(world)]}, "oci:", None),
        "lookaside over http": (scoped(repo, signed_by(world)), "signed:1", "http"),
        "lookaside over http, no signature (404)": (scoped(repo, signed_by(world)),
                                                    "unsigned:1", "http"),
        "lookaside missing": (scoped(repo, signed_by(world)), "signed:1", "missing"),
        "lookaside unreachable": (scoped(repo, signed_by(world)), "signed:1", "unreachable"),
        "invalid policy: unknown requirement": (
            {"default": [{"type": "acceptEverything"}]}, "signed:1", None),
        "invalid policy: not JSON": ("{\"default\": [", "signed:1", None),
        "invalid policy: unknown key": (
            {"default": [ACCEPT], "transports": {"docker": {repo: [
                dict(signed_by(world), keyFile="/x")]}}}, "signed:1", None),
        "invalid policy: a docker-archive scope": (
            {"default": [ACCEPT], "transports": {"docker-archive": {"/a.tar": [REJECT]}}},
            "signed:1", None),
        "invalid policy: a docker-daemon digest scope": (
            {"default": [ACCEPT], "transports": {"docker-daemon": {
                "sha256:" + "a" * 64: [REJECT]}}}, "signed:1", None),
        "a docker-daemon namespace scope": (
            {"default": [ACCEPT], "transports": {"docker-daemon": {
                "localhost:5000": [REJECT]}}}, "signed:1", None),
        "sigstoreSigned": (
            scoped(repo, {"type": "sigstoreSigned", "keyPath": str(world.good_key)}),
            "signed:1", None),
    }
    return table[case]


CASES = [
    ("right key", True), ("right key, armored keyPath", True), ("wrong key", False),
    ("no signature", False), ("two signatures, one good", True),
    ("signature of another digest", False), ("keyPaths, the right one second", True),
    ("keyPaths, only the other key", False), ("keyData", True),
    ("matchRepoDigestOrExact, other tag", False), ("matchRepoDigestOrExact, by digest", True),
    ("matchExact, by digest", False), ("matchExact, same tag", True),
    ("matchRepository, other tag", True), ("matchRepository, other repository", False),
    ("identity mismatch (default)", False), ("exactReference", True),
    ("exactReference, other tag", False), ("exactRepository", True),
    ("exactRepository, other", False), ("remapIdentity", True),
    ("remapIdentity, no prefix match", False),
    ("precedence: repository reject over namespace signedBy", False),
    ("precedence: tag accept over repository reject", True),
    ("precedence: host signedBy over default accept", False),
    ("precedence: wildcard", False), ("precedence: transport default scope", False),
    ("reject default", False), ("insecureAcceptAnything", True),
    ("all requirements must hold", False),
    ("multi-arch index, every manifest signed", True),
    ("multi-arch, only the index signed", False),
    # containers/image 5.23 compares the signing (sub)key's fingerprint with the primary keys
    # imported: a signature made by a subkey is not accepted (sign with the primary key)
    ("signed by a signing subkey of the policy's key", False),
    ("oci: scope reject", False), ("oci: scope accept over default reject", True),
    ("oci: a DIR:TAG scope never matches (the tag is no part of the identity)", False),
    ("oci: the parent directory's scope", False),
    ("oci: signedBy (no signatures in a layout)", False),
    ("lookaside over http", True), ("lookaside over http, no signature (404)", False),
    ("lookaside missing", False), ("lookaside unreachable", False),
    ("invalid policy: unknown requirement", False), ("invalid policy: not JSON", False),
    ("invalid policy: unknown key", False),
    ("invalid policy: a docker-archive scope", False),
    ("invalid policy: a docker-daemon digest scope", False),
    ("a docker-daemon namespace scope", True), ("sigstoreSigned", False),
]


def _registries_d(world: World, override: str | None) -> Path:
    if override is None:
        return world.registries_d
    directory = world.directory / f"registries.d-{override}"
    directory.mkdir(exist_ok=True)
    url = {"missing": f"file://{world.directory}/no-such-store",
           "unreachable": "http://127.0.0.1:9/sigstore",  # discard port: refused
           "http": world.http}[override]
    (directory / "default.yaml").write_text(f"default-docker:\n  lookaside: {url}\n")
    return directory


@pytest.mark.parametrize(("case", "expected"), CASES, ids=[case for case, _ in CASES])
def test_ocistage_decides_as_skopeo(world: World, ocistage: OcistageRunner, tmp_path: Path,
                                    case: str, expected: bool) -> None:
    document, name, override = policy_for(world, case)
    policy = tmp_path / "policy.json"
    policy.write_text(document if isinstance(document, str) else json.dumps(document))
    registries_d = _registries_d(world, override)
    ref = f"oci:{world.layout}" if name == "oci:" else world.ref(name)
    oracle = world.skopeo("copy", "--quiet", f"--policy={policy}",
                          f"--registries.d={registries_d}",
                          *world.registry.skopeo_flags("src-"),
                          f"--override-arch={host_architecture()}",
                          ref if name == "oci:" else f"docker://{ref}",
                          f"dir:{tmp_path / 'copy'}")
    skopeo_accepts = oracle.returncode == 0
    result = ocistage("pull", "--json", f"--policy={policy}",
                      f"--registries.d={registries_d}", ref)
    ours = result.returncode == 0
    assert (ours, skopeo_accepts) == (expected, expected), (
        f"ocistage: {result.stderr.strip()}\nskopeo: {oracle.stderr.strip()}")
    if ours:
        verdict = json.loads(result.stdout)["trust"]
        assert verdict["accepted"] is True
        if verdict["requirement"].startswith("signedBy"):
            assert verdict["fingerprint"] == world.good
    else:
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "hint:" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        if not case.startswith("invalid policy"):
            assert ref in errors[0] and "scope" in errors[0], errors[0]
            # nothing of a rejected image is kept: no record, no blob (decided before any
            # layer or the config was fetched)
            assert not (ocistage.cache / "index.json").exists() or \
                ref not in (ocistage.cache / "index.json").read_text()
            blobs = ocistage.cache / "blobs" / "sha256"
            assert not blobs.exists() or not any(blobs.iterdir())


def _policy(tmp_path: Path, name: str, document: Any) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(document))
    return f"--policy={path}"


def test_warm_paths_decide_against_the_current_policy(world: World, ocistage: OcistageRunner,
                                                      tmp_path: Path) -> None:
    """A cached image is re-judged by the policy of each command, from the signatures kept
    with it (fetched once when it was cached before any policy asked for them), offline."""
    repo = f"{world.registry.host}/{world.namespace}"
    good = _policy(tmp_path, "good", {"default": [REJECT], "transports": {"docker": {
        repo: [signed_by(world)]}}})
    other = _policy(tmp_path, "other", {"default": [REJECT], "transports": {"docker": {
        repo: [signed_by(world, keyPath=str(world.other_key))]}}})
    reject = _policy(tmp_path, "reject", {"default": [REJECT]})
    accept = _policy(tmp_path, "accept", {"default": [ACCEPT]})
    lookaside = f"--registries.d={world.registries_d}"
    offline = f"--registries.d={_registries_d(world, 'unreachable')}"
    signed, two = world.ref("signed:1"), world.ref("two:1")

    assert ocistage("pull", good, lookaside, signed).returncode == 0
    kept = list((ocistage.cache / "signatures").glob(
        f"{world.digests['signed:1'].replace(':', '-')}-*.json"))
    assert len(kept) == 1
    # offline, the kept signatures decide; a changed policy takes effect at once
    for policy, ok in ((good, True), (other, False), (reject, False), (accept, True)):
        for command in (("pull", "--pull=never"), ("pull", "--pull=missing"),
                        ("bundle", "--pull=never")):
            result = ocistage(*command, policy, offline, signed)
            assert (result.returncode == 0) is ok, (policy, command, result.stderr)
            if not ok:
                assert "is rejected by the policy" in result.stderr
    # cached before any policy: its signatures are fetched once, then kept
    assert ocistage("pull", accept, lookaside, two).returncode == 0
    assert ocistage("pull", "--pull=never", good, offline, two).returncode != 0
    assert ocistage("pull", "--pull=never", good, lookaside, two).returncode == 0
    assert ocistage("pull", "--pull=never", good, offline, two).returncode == 0


def test_an_invalid_policy_fails_every_command_that_pulls(world: World,
                                                          ocistage: OcistageRunner,
                                                          tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"default": []}')
    for command in (("pull",), ("bundle",), ("stage", f"--to={tmp_path / 'stage'}")):
        result = ocistage(*command, f"--policy={bad}", world.ref("signed:1"))
        assert result.returncode == 1, result.stderr
        assert f"error: invalid policy in {bad}" in result.stderr
        assert "Traceback" not in result.stderr


def test_trust_show_judges_a_reference(world: World, ocistage: OcistageRunner,
                                       tmp_path: Path) -> None:
    repo = f"{world.registry.host}/{world.namespace}"
    policy = _policy(tmp_path, "good", {"default": [REJECT], "transports": {"docker": {
        repo: [signed_by(world)]}}})
    lookaside = f"--registries.d={world.registries_d}"
    shown = ocistage("trust", "show", "--json", policy, lookaside, world.ref("signed:1"))
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert [s["scope"] for s in report["scopes"]] == ["default", repo]
    assert report["image"]["accepted"] is True
    assert report["image"]["fingerprint"] == world.good
    assert report["image"]["digest"] == world.digests["signed:1"]
    shown = ocistage("trust", "show", "--json", policy, lookaside, world.ref("unsigned:1"))
    assert shown.returncode == 0, shown.stderr
    image = json.loads(shown.stdout)["image"]
    assert image["accepted"] is False and "no signature" in image["reason"]
    assert not (ocistage.cache / "signatures").exists()  # trust show keeps nothing
    human = ocistage("trust", "show", policy, lookaside, world.ref("signed:1"))
    assert f"signed by: {world.good}" in human.stdout
