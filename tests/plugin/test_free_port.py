"""pytest_ocistage.components.free_port: ports for daemons that bind them later."""

from __future__ import annotations

import socket

import pytest

from pytest_ocistage.components import _ephemeral_range, free_port


def test_ports_are_outside_the_ephemeral_range_distinct_and_free() -> None:
    """An outgoing connection can take a port of the ephemeral range before a daemon binds
    it (a slurmd in CI: "Unable to bind listen port"); ports below it cannot be taken so."""
    low, high = _ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(not low <= port <= high for port in ports)
    for port in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # nothing listens there


def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three candidate ports, one of them held by a listener: the other two are handed out,
    then (none left) the kernel's choice."""
    import pytest_ocistage.components as components

    low, _high = _ephemeral_range()
    monkeypatch.setattr(components, "_LOWEST_PORT", low - 3)
    monkeypatch.setattr(components, "_HANDED_OUT", set())
    candidates = {low - 3, low - 2, low - 1}
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        for port in sorted(candidates):
            try:
                held.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        else:
            pytest.skip("all three candidate ports are in use on this host")
        held.listen()
        taken = held.getsockname()[1]
        first, second = free_port(), free_port()
        assert {first, second} <= candidates - {taken}
        assert first != second
        assert free_port() not in candidates  # none left below the range: bind(0)
    finally:
        held.close()
