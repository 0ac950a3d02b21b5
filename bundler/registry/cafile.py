"""The extra CA bundle of HTTPS registries (``--ca-file``, ``$OCISTAGE_CA_FILE``, ``ca_file``).

A missing, unreadable or empty file would otherwise surface at the first connection, as an
``OSError`` retried six times or as a TLS handshake failure that blames the registry. So the
file is checked once, before any connection, and a problem is a usage error naming where the
file was given. Only ``ssl`` is imported: ``ocistage doctor`` checks the file without loading
the HTTP client.
"""

from __future__ import annotations

import os
import ssl
import stat

from ocistage.bundler.registry.errors import CaFileError

#: a CA bundle is kilobytes (Debian's whole store is ~200 KiB); anything this large is not one
CA_FILE_LIMIT = 16 << 20


def check_ca_file(path: str, origin: str) -> int:
    """The number of CA certificates in the PEM file ``path``; :class:`CaFileError` naming
    ``origin`` ("option --ca-file", "file ~/.config/ocistage/config.toml") when the file is
    missing, unreadable, not a regular file, too large or holds no certificate. The file is
    parsed as the TLS connections will load it (``SSLContext.load_verify_locations``)."""
    text = _read(path, origin)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cadata=text)
    except (ssl.SSLError, ValueError) as exc:  # none found, or a block that does not parse
        raise _error(path, origin, "it holds no PEM certificate that parses") from exc
    return int(context.cert_store_stats()["x509_ca"])


def _read(path: str, origin: str) -> str:
    """The file's text, opened without waiting on a FIFO and read up to the limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _error(path, origin, (exc.strerror or str(exc)).lower()) from exc
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise _error(path, origin, "it is a directory (give one file: cat DIR/*.crt > FILE)")
        if not stat.S_ISREG(info.st_mode):
            raise _error(path, origin, "it is not a regular file")
        if info.st_size > CA_FILE_LIMIT:
            raise _error(path, origin, f"it is larger than {CA_FILE_LIMIT >> 20} MiB")
        data = os.read(fd, CA_FILE_LIMIT + 1)
        while len(data) <= CA_FILE_LIMIT and (more := os.read(fd, CA_FILE_LIMIT + 1 - len(data))):
            data += more
    except OSError as exc:
        raise _error(path, origin, (exc.strerror or str(exc)).lower()) from exc
    finally:
        os.close(fd)
    if len(data) > CA_FILE_LIMIT:
        raise _error(path, origin, f"it is larger than {CA_FILE_LIMIT >> 20} MiB")
    return data.decode("ascii", errors="replace")


def _error(path: str, origin: str, why: str) -> CaFileError:
    return CaFileError(f"cannot use the CA file {path} ({origin}): {why}")
