"""Deploy tests reuse the collectives tests' gloo worlds; close them all at the end."""

import pytest

from collectives import _harness


@pytest.fixture(scope="session", autouse=True)
def _close_worlds():
    yield
    _harness.close_all()
