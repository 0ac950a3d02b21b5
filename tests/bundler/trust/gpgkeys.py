"""Throwaway GnuPG keys for the trust tests: made in a private GNUPGHOME, never the user's,
whose agent is stopped (``gpgconf --kill all``) before the directory is removed."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ocistage.bundler.trust.gpg import clean_home


class Signer:
    """A GNUPGHOME with keys that can sign and export."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def gpg(self, *args: str, data: bytes = b"", at: str | None = None) -> bytes:
        """Run gpg; ``at`` (``20200101T000000``) fakes the clock, for keys long expired."""
        clock = [f"--faked-system-time={at}!"] if at else []
        done = subprocess.run(["gpg", f"--homedir={self.home}", "--batch", "--no-tty",
                               "--pinentry-mode=loopback", "--passphrase=", *clock, *args],
                              input=data, capture_output=True, check=True)
        return done.stdout

    def new_key(self, uid: str, expire: str = "never", at: str | None = None) -> str:
        self.gpg("--quick-gen-key", uid, "default", "default", expire, at=at)
        listing = self.gpg("--with-colons", "--list-keys", uid).decode()
        return next(line.split(":")[9] for line in listing.splitlines()
                    if line.startswith("fpr:"))

    def export(self, fingerprint: str, armor: bool = False) -> bytes:
        return self.gpg(*(["--armor"] if armor else []), "--export", fingerprint)

    def sign(self, fingerprint: str, payload: bytes, at: str | None = None) -> bytes:
        return self.gpg(f"--local-user={fingerprint}", "--sign", data=payload, at=at)

    def revoke(self, fingerprint: str) -> None:
        certificate = self.home / "openpgp-revocs.d" / f"{fingerprint}.rev"
        text = certificate.read_text().replace(":-----BEGIN", "-----BEGIN")
        self.gpg("--import", data=text.encode())


@contextmanager
def signer() -> Iterator[Signer]:
    home = Path(tempfile.mkdtemp(prefix="ocistage-test-gpg-"))
    try:
        yield Signer(home)
    finally:
        subprocess.run(["gpgconf", f"--homedir={home}", "--kill", "all"], check=False)
        clean_home(str(home))


def payload(digest: str, reference: str) -> bytes:
    return json.dumps({"critical": {"type": "atomic container signature",
                                    "image": {"docker-manifest-digest": digest},
                                    "identity": {"docker-reference": reference}},
                       "optional": {"creator": "test", "timestamp": 1}}).encode()


@contextmanager
def socket_dirs_cleaned() -> Iterator[None]:
    """Remove the empty GnuPG socket directories (``/run/user/UID/gnupg/d.*``) that appear
    meanwhile: gpg makes one for every home it is run with, skopeo's gpgme for each of its
    ephemeral keyrings too, and none removes them (and ``gnupg/`` itself, if it was made)."""
    parent = Path("/run/user") / str(os.getuid()) / "gnupg"
    existed = parent.is_dir()
    before = set(parent.iterdir()) if existed else set()
    try:
        yield
    finally:
        if parent.is_dir():
            for directory in set(parent.iterdir()) - before:
                with contextlib.suppress(OSError):
                    directory.rmdir()  # only an empty one: a running agent keeps its own
            if not existed:
                with contextlib.suppress(OSError):
                    parent.rmdir()
