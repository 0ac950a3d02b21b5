"""OpenPGP verification with GnuPG's ``gpgv`` and a throwaway keyring file.

skopeo's gpgme imports the policy's keys into an ephemeral GnuPG home and verifies with gpg;
ocistage hands the same keys to ``gpgv`` (the same verification code of GnuPG, one process,
no home state, no agent) as a keyring file in a private directory (``mkdtemp``, 0700),
armoured keys decoded here (:func:`dearmor`). A signature is accepted when gpgv reports
exactly one signature, good (``GOODSIG``, ``VALIDSIG``; an expired or revoked key, an
expired or bad signature is not), made by a primary key of the keyring (containers/image
5.23 compares the signer's fingerprint with the primary keys it imported: a subkey's
signature is not accepted there either). The user's keyring, agent and trust database are
never used; the directory is removed when the keyring is closed.
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
GPGV = "gpgv"


class GpgMissing(Exception):
    """GnuPG's ``gpgv`` is not installed."""


@dataclass(frozen=True)
class Verified:
    """The signed payload, the fingerprint of the key that signed it and of its primary key
    (the same unless a subkey signed)."""

    payload: bytes
    fingerprint: str
    primary: str


def _status(text: bytes) -> list[list[str]]:
    lines = []
    for line in text.decode("utf-8", "replace").splitlines():
        if line.startswith("[GNUPG:] "):
            lines.append(line[len("[GNUPG:] "):].split(" "))
    return lines


CRC24_INIT = 0xB704CE
CRC24_POLY = 0x1864CFB


def _crc24_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= CRC24_POLY
        table.append(crc & 0xFFFFFF)
    return tuple(table)


_CRC24_TABLE = _crc24_table()


def _crc24(data: bytes) -> int:
    """RFC 4880's CRC-24 of ``data``, a table lookup per byte."""
    crc = CRC24_INIT
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFF) ^ _CRC24_TABLE[((crc >> 16) ^ byte) & 0xFF]
    return crc


def dearmor(data: bytes) -> bytes:
    """Binary OpenPGP from ``data``: armoured blocks (RFC 4880 section 6: headers, base64,
    the CRC-24 checked) are decoded, binary data is kept; several of each may follow one
    another (``keyPaths`` are concatenated). SignatureRejected for broken armour."""
    import base64
    import binascii

    if b"-----BEGIN PGP" not in data:
        return data
    out = bytearray()
    lines = data.decode("ascii", "replace").splitlines()
    n = 0
    while n < len(lines):
        if not lines[n].startswith("-----BEGIN PGP"):
            n += 1
            continue
        n += 1
        while n < len(lines) and lines[n].strip():  # armour headers, up to the blank line
            n += 1
        body: list[str] = []
        checksum: str | None = None
        while n < len(lines) and not lines[n].startswith("-----END PGP"):
            line = lines[n].strip()
            if line.startswith("=") and len(line) == 5:
                checksum = line[1:]
            elif line:
                body.append(line)
            n += 1
        if n >= len(lines):
            raise SignatureRejected("a key is armoured OpenPGP without its END line")
        try:
            block = base64.b64decode("".join(body), validate=True)
            if checksum is not None and \
                    int.from_bytes(base64.b64decode(checksum), "big") != _crc24(block):
                raise SignatureRejected("a key's armour checksum is wrong")
        except (binascii.Error, ValueError):
            raise SignatureRejected("a key is not valid armoured OpenPGP") from None
        out += block
        n += 1
    return bytes(out)


class ThrowawayKeyring:
    """A private keyring file of ``keys`` in a private directory, read by ``gpgv``; use it as
    a context manager."""

    def __init__(self, keys: bytes) -> None:
        gpgv = shutil.which(GPGV)
        if gpgv is None:
            raise GpgMissing("gpgv is not installed")
        if len(keys) > KEYS_LIMIT:
            raise SignatureRejected(f"the keys are larger than {KEYS_LIMIT} bytes")
        binary = dearmor(keys)
        self._gpgv = gpgv
        self.home = tempfile.mkdtemp(prefix="ocistage-gpg-")
        try:
            self.keyring = os.path.join(self.home, "keys.gpg")
            with open(self.keyring, "wb") as stream:
                stream.write(binary)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ThrowawayKeyring:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def verify(self, signature: bytes) -> Verified:
        """The payload and signer of ``signature`` (an OpenPGP signed message), or
        :class:`SignatureRejected` saying why it is not accepted."""
        path = os.path.join(self.home, "signature")
        with open(path, "wb") as stream:
            stream.write(signature)
        read_end, write_end = os.pipe()
        argv = [self._gpgv, f"--homedir={self.home}", f"--keyring={self.keyring}",
                f"--status-fd={write_end}", "--output=-", "--", path]
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C",
                       "GNUPGHOME": self.home}
        try:
            with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=environment,
                                  pass_fds=(write_end,)) as child:
                os.close(write_end)
                write_end = -1
                payload, status = _collect(child, read_end)
        finally:
            if write_end >= 0:
                os.close(write_end)
            os.close(read_end)
            os.unlink(path)
        return _judge(child.returncode, payload, _status(status))

    def close(self) -> None:
        """Remove the directory (gpgv starts no agent; its socket directory, if gpgv made
        one, goes too)."""
        clean_home(self.home)


def _collect(child: subprocess.Popen[bytes], status_fd: int) -> tuple[bytes, bytes]:
    """gpgv's stdout (the payload, at most PAYLOAD_LIMIT + 1 bytes: beyond, it is killed)
    and its status lines (at most 1 MiB), within TIMEOUT."""
    import selectors
    import time

    assert child.stdout is not None
    deadline = time.monotonic() + TIMEOUT
    payload, status = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ, payload)
        selector.register(status_fd, selectors.EVENT_READ, status)
        open_streams = 2
        while open_streams:
            left = deadline - time.monotonic()
            if left <= 0:
                child.kill()
                raise SignatureRejected(f"gpgv did not finish within {TIMEOUT:.0f} s")
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                key.data.extend(chunk)
                if len(payload) > PAYLOAD_LIMIT or len(status) > 1 << 20:
                    child.kill()
                    raise SignatureRejected("the signed payload is larger than "
                                            f"{PAYLOAD_LIMIT} bytes")
    child.wait()
    return bytes(payload), bytes(status)


def _judge(returncode: int | None, payload: bytes, lines: list[list[str]]) -> Verified:
    """What gpgme reports as a valid signature: exactly one, good, by a key of the keyring
    (an expired or revoked key, an expired or bad signature is not)."""
    verdicts = [fields for fields in lines if fields[0] in (
        "GOODSIG", "EXPSIG", "EXPKEYSIG", "REVKEYSIG", "BADSIG", "ERRSIG")]
    signatures = sum(1 for fields in lines if fields[0] == "NEWSIG")
    if signatures == 0:
        raise SignatureRejected("not a valid OpenPGP signature")
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
    if returncode != 0 or len(valid) != 1:
        raise SignatureRejected("GnuPG does not confirm the signature")
    signer = valid[0][1].upper()
    primary = valid[0][10].upper() if len(valid[0]) > 10 else signer
    return Verified(payload, signer, primary)


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
