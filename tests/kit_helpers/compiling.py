"""Compiling in tests: the backend axis, counted compiles, graph breaks, result comparison.

Kept here so the test modules read as statements of behaviour, not set-up.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

from subclass_kit.testing._compare import difference

# Backend axis with readable ids; inductor compiles C++ and is kept to a few slow tests.
BACKENDS = [
    pytest.param("eager", id="eager"),
    pytest.param("aot_eager", id="aot_eager"),
    pytest.param("inductor", id="inductor", marks=pytest.mark.slow),
]
FAST_BACKENDS = [pytest.param("eager", id="eager"), pytest.param("aot_eager", id="aot_eager")]


def compile_counted(fn, backend: str, **kwargs):
    """``torch.compile(fn, fullgraph=True)`` with a counter; returns (compiled, counter)."""
    cnt = CompileCounterWithBackend(backend)
    return torch.compile(fn, backend=cnt, fullgraph=True, **kwargs), cnt


def graph_breaks() -> int:
    """Total graph breaks dynamo recorded since the last ``counters.clear()``."""
    return sum(counters["graph_break"].values())


def assert_same(actual, expected) -> None:
    """Results that should be the same are: the containers' types, then
    ``subclass_kit.testing``'s comparison (wrapped: type, ctx, outer shape and dtype, every
    inner tensor; plain: values at torch's tolerances for the dtype)."""
    assert type(actual) is type(expected), (type(actual), type(expected))
    diff = difference(actual, expected)
    assert diff is None, diff


def storage_id(t) -> int:
    """Identity of the StorageImpl behind ``t`` (wrapper storages have no data pointer)."""
    return t.untyped_storage()._cdata
