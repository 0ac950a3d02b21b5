"""Reading a registry's answers: ``Retry-After``, the error body of a failed request, a
manifest's media type and a ranged blob's ``Content-Range``."""

from __future__ import annotations

import email.utils
import re
from datetime import UTC, datetime

import requests

from ocistage.bundler.registry.errors import RegistryUnreachable
from ocistage.bundler.registry.transport import Transport
from ocistage.cache.jsondoc import parse_json

ERROR_BODY_LIMIT = 64 << 10
_GENERIC_TYPES = frozenset({"", "application/json", "text/plain", "application/octet-stream"})
_CONTENT_RANGE_RE = re.compile(r"^bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)$")


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def error_detail(transport: Transport, response: requests.Response) -> str:
    """``CODE: message`` entries of a distribution error body, or the HTTP reason."""
    try:
        body = transport.read_body(response, ERROR_BODY_LIMIT)
    except RegistryUnreachable:
        body = None
    try:
        errors = parse_json(body or b"").get("errors")
        parts = [f"{e.get('code', 'UNKNOWN')}: {e.get('message', '')}".rstrip(": ")
                 for e in errors if isinstance(e, dict)]
        if parts:
            return "; ".join(parts)
    except (ValueError, AttributeError, TypeError):
        pass
    return f"HTTP {response.status_code} {response.reason or ''}".rstrip()


def media_type_of(response: requests.Response, data: bytes) -> str:
    declared = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if declared not in _GENERIC_TYPES:
        return declared
    try:
        document = parse_json(data)
    except ValueError:
        return declared
    if not isinstance(document, dict):
        return declared
    media_type = document.get("mediaType")
    if isinstance(media_type, str) and media_type:
        return media_type
    if document.get("schemaVersion") == 1:
        return "application/vnd.docker.distribution.manifest.v1+json"
    if "manifests" in document:
        return "application/vnd.oci.image.index.v1+json"
    return "application/vnd.oci.image.manifest.v1+json"


def content_range(response: requests.Response) -> tuple[int | None, int | None]:
    """(first byte, total size) from ``Content-Range``; None where absent or ``*``."""
    match = _CONTENT_RANGE_RE.match(response.headers.get("Content-Range", "").strip())
    if match is None:
        return None, None
    start = int(match.group(1)) if match.group(1) is not None else None
    total = int(match.group(3)) if match.group(3) != "*" else None
    return start, total


