"""Compiling in tests: the backend axis, counted compiles, graph breaks, result comparison.

Kept here so the test modules read as statements of behaviour, not set-up.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

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


def assert_same(actual, expected, **tol) -> None:
    """Equal type, metadata and values, recursing into wrapper subclasses' inner tensors."""
    assert type(actual) is type(expected), (type(actual), type(expected))
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, **tol)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if hasattr(type(expected), "__tensor_flatten__"):
        names, ctx = expected.__tensor_flatten__()
        a_names, a_ctx = actual.__tensor_flatten__()
        assert a_names == names and a_ctx == ctx, (a_names, a_ctx, names, ctx)
        for n in names:
            assert_same(getattr(actual, n), getattr(expected, n), **tol)
    else:
        torch.testing.assert_close(actual, expected, **tol)


def storage_id(t) -> int:
    """Identity of the StorageImpl behind ``t`` (wrapper storages have no data pointer)."""
    return t.untyped_storage()._cdata
