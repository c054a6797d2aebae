"""Shared test set-up: an isolated inductor cache, a dynamo reset around every test."""

import os
import pathlib

_ROOT = pathlib.Path(__file__).resolve().parent.parent
# Keep compile caches under the repo's ignored build dir so runs don't interfere with
# other checkouts; set before torch compiles anything.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_ROOT / "build" / "inductor-cache"))

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
