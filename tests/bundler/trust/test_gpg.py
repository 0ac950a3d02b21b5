"""Signature verification with the real GnuPG and a throwaway keyring: every key and
signature is hostile, and each bad one is a rejection (never a hang or a traceback)."""

from __future__ import annotations

import base64
import glob
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocistage.bundler.trust.errors import SignatureRejected
from ocistage.bundler.trust.evaluate import evaluate
from ocistage.bundler.trust.gpg import ThrowawayKeyring, socket_dirs
from ocistage.bundler.trust.policy import Policy, Requirement, parse_identity
from ocistage.bundler.trust.scopes import image_identity
from ocistage.cache.digest import Digest
from pytest_ocistage.components import require_binary
from tests.bundler.trust.gpgkeys import Signer, payload, signer, socket_dirs_cleaned

DIGEST = Digest.parse("sha256:" + "c" * 64)
REF = "reg.example:5000/ns/app:1"


@pytest.fixture(scope="module")
def keys() -> Iterator[tuple[Signer, str, str]]:
    require_binary("gpg")
    require_binary("gpgv")
    with socket_dirs_cleaned(), signer() as made:
        yield made, made.new_key("Good <good@example>"), made.new_key("Other <o@example>")


def verdict(requirement: Requirement, signatures: list[bytes]) -> tuple[bool, str, str | None]:
    from ocistage.bundler.image.reference import parse_reference

    policy = Policy(Path("/p"), (requirement,))
    found = evaluate(policy, image_identity(parse_reference(REF)), REF, DIGEST,
                     lambda: signatures)
    return found.accepted, found.reason, found.fingerprint


def signed_by(data: bytes, identity: dict[str, str] | None = None) -> Requirement:
    return Requirement("signedBy", key_type="GPGKeys", key_data=data,
                       identity=parse_identity(identity or {"type": "matchRepoDigestOrExact"},
                                               "signedIdentity"))


def test_the_right_key_is_accepted_with_its_fingerprint(keys: tuple[Signer, str, str]) -> None:
    made, good, _ = keys
    signature = made.sign(good, payload(str(DIGEST), REF))
    for data in (made.export(good), made.export(good, armor=True)):
        assert verdict(signed_by(data), [signature]) == (True, "", good)


def test_rejections(keys: tuple[Signer, str, str], tmp_path: Path) -> None:
    made, good, other = keys
    key = made.export(good)
    cases = {
        "another key": ([made.sign(other, payload(str(DIGEST), REF))],
                        "does not name"),
        "another digest": ([made.sign(good, payload("sha256:" + "d" * 64, REF))],
                           "is for the manifest"),
        "another identity": ([made.sign(good, payload(str(DIGEST), "reg.example:5000/x:1"))],
                             "identity"),
        "not OpenPGP": ([b"hello, not a signature"], "signature"),
        "nothing": ([], "no signature exists"),
        "not JSON": ([made.sign(good, b"\xff" * 10)], "not JSON"),
        "a huge payload": ([made.sign(good, b"{" + b" " * (200 << 10))], "payload"),
    }
    for name, (signatures, reason) in cases.items():
        accepted, why, _ = verdict(signed_by(key), signatures)
        assert not accepted, name
        assert reason in why, (name, why)
    # two signatures, one good: accepted
    two = [made.sign(other, payload(str(DIGEST), REF)), made.sign(good, payload(str(DIGEST),
                                                                                  REF))]
    assert verdict(signed_by(key), two)[0]
    # keys that are no keys, or broken armour
    assert "does not name" in verdict(signed_by(b"garbage"), two[1:])[1]
    assert "no public keys" in verdict(signed_by(b"\n"), two[1:])[1]
    armored = made.export(good, armor=True).decode()
    broken = armored.replace("\n=", "\n=AAAA\n=", 1) if "\n=" in armored else armored
    checksum = [line for line in armored.splitlines() if line.startswith("=")]
    if checksum:
        wrong = armored.replace(checksum[0], "=AAAA")
        assert "checksum" in verdict(signed_by(wrong.encode()), two[1:])[1]
    del broken
    truncated = armored.split("-----END")[0].encode()
    assert "END line" in verdict(signed_by(truncated), two[1:])[1]


def test_expired_and_revoked_keys_are_rejected() -> None:
    require_binary("gpg")
    require_binary("gpgv")
    with socket_dirs_cleaned(), signer() as made:
        # made and used in 2020, valid for a day: long expired now
        expiring = made.new_key("Old <old@example>", expire="1d", at="20200101T000000")
        signature = made.sign(expiring, payload(str(DIGEST), REF), at="20200101T120000")
        accepted, reason, _ = verdict(signed_by(made.export(expiring)), [signature])
        assert not accepted and "expired" in reason
        revoked = made.new_key("Gone <gone@example>")
        signature = made.sign(revoked, payload(str(DIGEST), REF))
        made.revoke(revoked)
        accepted, reason, _ = verdict(signed_by(made.export(revoked)), [signature])
        assert not accepted and "revoked" in reason


def test_key_paths_that_are_fifos_huge_or_links(keys: tuple[Signer, str, str],
                                                tmp_path: Path) -> None:
    made, good, _ = keys
    signature = made.sign(good, payload(str(DIGEST), REF))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge"
    with huge.open("wb") as stream:
        stream.truncate(1 << 30)
    real = tmp_path / "real.gpg"
    real.write_bytes(made.export(good))
    link = tmp_path / "link.gpg"
    link.symlink_to(real)

    def by_path(*paths: Path) -> tuple[bool, str, str | None]:
        requirement = Requirement("signedBy", key_type="GPGKeys",
                                  key_paths=tuple(str(p) for p in paths))
        return verdict(requirement, [signature])

    assert "not a regular file" in by_path(fifo)[1]
    assert "larger than" in by_path(huge)[1]
    assert "No such file" in by_path(tmp_path / "missing")[1]
    assert by_path(link) == (True, "", good)  # followed, as skopeo does
    assert by_path(tmp_path / "missing", real)[0] is False  # every keyPath must be readable


def test_the_throwaway_home_is_removed_and_no_agent_is_left(
        keys: tuple[Signer, str, str]) -> None:
    made, good, _ = keys
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "ocistage-gpg-*")))
    with ThrowawayKeyring(made.export(good)) as ring:
        home = ring.home
        assert os.stat(home).st_mode & 0o077 == 0
        ring.verify(made.sign(good, b"x"))
    assert not os.path.exists(home)
    assert not any(os.path.exists(d) for d in socket_dirs(home))  # gpg's, for this home
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "ocistage-gpg-*"))) == before
    agents = [p for p in glob.glob("/proc/[0-9]*/cmdline")
              if home.encode() in _read(p)]
    assert agents == []


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as stream:
            return stream.read()
    except OSError:
        return b""


def test_a_signature_is_never_an_option(keys: tuple[Signer, str, str]) -> None:
    made, good, _ = keys
    with ThrowawayKeyring(made.export(good)) as ring, pytest.raises(SignatureRejected):
        ring.verify(b"--help")


def test_key_data_in_the_policy(keys: tuple[Signer, str, str]) -> None:
    made, good, _ = keys
    encoded = base64.b64encode(made.export(good)).decode()
    requirement = signed_by(base64.b64decode(encoded))
    assert verdict(requirement, [made.sign(good, payload(str(DIGEST), REF))])[0]
