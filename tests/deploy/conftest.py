"""Deploy tests reuse the collectives tests' gloo worlds; close them all at the end."""

import pytest

from kit_helpers import harness as _harness


@pytest.fixture(scope="session", autouse=True)
def _close_worlds():
    yield
    _harness.close_all()
