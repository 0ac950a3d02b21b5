"""OpenPGP verification with GnuPG and a throwaway keyring (what skopeo's gpgme does).

A :class:`ThrowawayKeyring` is a private ``GNUPGHOME`` (``mkdtemp``, 0700) holding only the
keys a policy requirement names; the user's keyring, agent and trust database are never
used. A signature is accepted when GnuPG reports exactly one signature, good (``GOODSIG``,
``VALIDSIG``; an expired or revoked key, an expired or bad signature is not), made by a key
that was imported from the requirement's keys (its fingerprint, as containers/image
compares). Closing the keyring stops any agent it started and removes the directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from types import TracebackType

from ocistage.bundler.trust.errors import SignatureRejected

PAYLOAD_LIMIT = 64 << 10  # a simple-signing payload is a few hundred bytes
KEYS_LIMIT = 8 << 20
TIMEOUT = 60.0
GPG = "gpg"


class GpgMissing(Exception):
    """GnuPG (``gpg``) is not installed."""


@dataclass(frozen=True)
class Verified:
    """The signed payload and the fingerprint of the key that signed it."""

    payload: bytes
    fingerprint: str


def _status(text: bytes) -> list[list[str]]:
    lines = []
    for line in text.decode("utf-8", "replace").splitlines():
        if line.startswith("[GNUPG:] "):
            lines.append(line[len("[GNUPG:] "):].split(" "))
    return lines


class ThrowawayKeyring:
    """A private GnuPG home holding ``keys``; use it as a context manager."""

    def __init__(self, keys: bytes) -> None:
        gpg = shutil.which(GPG)
        if gpg is None:
            raise GpgMissing("gpg is not installed")
        self._gpg = gpg
        self.home = tempfile.mkdtemp(prefix="ocistage-gpg-")
        try:
            self.fingerprints = self._import(keys)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ThrowawayKeyring:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _run(self, arguments: list[str],
             stdin: bytes = b"") -> tuple[int, bytes, list[list[str]]]:
        status = os.path.join(self.home, "status")
        argv = [self._gpg, f"--homedir={self.home}", "--batch", "--no-tty", "--no-options",
                "--no-autostart",
                "--no-auto-key-retrieve", "--no-auto-key-locate", "--trust-model=always",
                f"--status-file={status}", *arguments]
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C",
                       "GNUPGHOME": self.home}
        try:
            done = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=environment, timeout=TIMEOUT,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise SignatureRejected(f"gpg did not finish within {TIMEOUT:.0f} s") from None
        try:
            with open(status, "rb") as stream:
                lines = _status(stream.read(1 << 20))
            os.unlink(status)
        except OSError:
            lines = []
        return done.returncode, done.stdout, lines

    def _import(self, keys: bytes) -> tuple[str, ...]:
        if len(keys) > KEYS_LIMIT:
            raise SignatureRejected(f"the keys are larger than {KEYS_LIMIT} bytes")
        _rc, _out, lines = self._run(["--import"], stdin=keys)
        found: list[str] = []
        for fields in lines:
            if fields[0] == "IMPORT_OK" and len(fields) >= 3 and fields[2] not in found:
                found.append(fields[2].upper())
        return tuple(found)

    def verify(self, signature: bytes) -> Verified:
        """The payload and signer of ``signature`` (an OpenPGP signed message), or
        :class:`SignatureRejected` saying why it is not accepted."""
        path = os.path.join(self.home, "signature")
        with open(path, "wb") as stream:
            stream.write(signature)
        rc, payload, lines = self._run(["--output=-", f"--max-output={PAYLOAD_LIMIT}",
                                        "--verify", "--", path])
        os.unlink(path)
        lengths = [fields[1] for fields in lines
                   if fields[0] == "PLAINTEXT_LENGTH" and len(fields) > 1]
        if len(payload) > PAYLOAD_LIMIT or any(
                not n.isdigit() or int(n) > PAYLOAD_LIMIT for n in lengths):
            raise SignatureRejected(f"the signed payload is larger than {PAYLOAD_LIMIT} bytes")
        verdicts = [fields for fields in lines if fields[0] in (
            "GOODSIG", "EXPSIG", "EXPKEYSIG", "REVKEYSIG", "BADSIG", "ERRSIG")]
        signatures = sum(1 for fields in lines if fields[0] == "NEWSIG")
        if signatures == 0:
            raise SignatureRejected("not a valid OpenPGP signature (or its signed payload is "
                                    f"larger than {PAYLOAD_LIMIT} bytes)")
        if signatures != 1 or len(verdicts) != 1:
            raise SignatureRejected(f"unexpected GPG signature count {signatures}")
        kind = verdicts[0][0]
        if kind == "ERRSIG" and len(verdicts[0]) > 6 and verdicts[0][6] == "9":
            raise SignatureRejected("signed by a key the policy does not name")
        if kind != "GOODSIG":
            reason = {"EXPSIG": "the signature has expired", "EXPKEYSIG": "the key has expired",
                      "REVKEYSIG": "the key is revoked", "BADSIG": "the signature is bad"}
            raise SignatureRejected(reason.get(kind, "the signature cannot be verified"))
        valid = [fields for fields in lines if fields[0] == "VALIDSIG" and len(fields) >= 2]
        if rc != 0 or len(valid) != 1:
            raise SignatureRejected("GnuPG does not confirm the signature")
        return Verified(payload, valid[0][1].upper())

    def close(self) -> None:
        """Stop any agent of this home (none is started: ``--no-autostart``; the check costs
        no process when there is no socket) and remove the home and its socket directory."""
        clean_home(self.home)


_ZBASE32 = "ybndrfg8ejkmcpqxot1uwisza345h769"


def socket_dirs(home: str) -> list[str]:
    """Where GnuPG 2.2 keeps the sockets of a home that is not the default one:
    ``/run/user/UID/gnupg/d.`` and the z-base-32 of the first 120 bits of the home's SHA-1
    (``_gnupg_socketdir_internal``); gpg makes it on every run, empty unless an agent runs."""
    import hashlib

    bits = int.from_bytes(hashlib.sha1(home.encode()).digest()[:15], "big")
    name = "d." + "".join(_ZBASE32[(bits >> (120 - 5 * (n + 1))) & 31] for n in range(24))
    return [os.path.join(base, str(os.getuid()), "gnupg", name)
            for base in ("/run/user", "/var/run/user")]


def _sockets(directory: str) -> bool:
    try:
        return any(name.startswith("S.") for name in os.listdir(directory))
    except OSError:
        return False


def clean_home(home: str) -> None:
    """Stop the agents of GnuPG home ``home`` if any runs, remove its socket directory (only
    when it is empty then) and the home itself."""
    directories = [d for d in socket_dirs(home) if os.path.isdir(d)]
    gpgconf = shutil.which("gpgconf")
    if gpgconf is not None and (_sockets(home) or any(_sockets(d) for d in directories)):
        subprocess.run([gpgconf, f"--homedir={home}", "--kill", "all"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=TIMEOUT, check=False)
    for directory in directories:
        with contextlib.suppress(OSError):
            os.rmdir(directory)  # only empty: an agent still running keeps its sockets
    shutil.rmtree(home, ignore_errors=True)
