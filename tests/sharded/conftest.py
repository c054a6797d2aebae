"""Sharded tests reuse the collectives tests' gloo worlds (one spawned world per size for
the whole session); close them all at the end."""

import pytest

from kit_helpers import harness as _harness


@pytest.fixture(scope="session", autouse=True)
def _close_worlds():
    yield
    _harness.close_all()
