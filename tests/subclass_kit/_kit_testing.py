"""Shared helpers for the subclass_kit tests (not a test module: the name starts with '_').

Backends, compile counting and the per-exemplar cases every compile test runs. Kept here so
the test modules read as statements of behaviour, not set-up.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

REPO = pathlib.Path(__file__).resolve().parents[2]

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


def inner_names(t) -> list:
    return t.__tensor_flatten__()[0]


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


def _child_env(env: dict | None) -> dict:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(pathlib.Path(__file__).parent), full_env.get("PYTHONPATH", "")]
    )
    full_env.update(env or {})
    return full_env


def run_pythons(jobs, *, timeout: float = 300) -> list:
    """Run ``python -c code`` for each ``(code, env)`` in fresh interpreters, concurrently
    (importing torch dominates; the machine has cores to overlap it). Returns the stdouts;
    raises with the output of any child that failed. Every child is reaped."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=_child_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for code, env in jobs
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise AssertionError(f"subprocess failed ({p.returncode}):\n{out}\n{err}")
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def run_python(code: str, *, env: dict | None = None, timeout: float = 300) -> str:
    """Run ``python -c code`` in a fresh interpreter from the repo root; return its stdout."""
    return run_pythons([(code, env)], timeout=timeout)[0]
