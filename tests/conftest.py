"""Fixtures every test gets: no detached remover of a test outlives it (tests/removers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.removers import reap, removers_of_test


@pytest.fixture(autouse=True)
def stray_removers(request: pytest.FixtureRequest) -> Iterator[None]:
    """After the test, wait (with a deadline) for the removers its stages started, and kill
    the sessions of those still running then."""
    yield
    nodeid = request.node.nodeid
    reap(lambda: removers_of_test(nodeid))
