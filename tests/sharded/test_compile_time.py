"""Compile-time work under dynamic shapes: each op's global metadata is computed once per
trace's shape env, not once per pass torch.compile makes over the graph."""

from __future__ import annotations

import torch
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit.sharded import MeshRef, Shard, distribute
from subclass_kit.sharded._ops import _common


def test_dynamic_compile_computes_each_ops_metadata_once(monkeypatch):
    calls = []
    real = _common._compute_meta

    def sig(a):
        if isinstance(a, torch.Tensor):
            return (type(a).__name__, str(tuple(a.shape)), str(a.stride()), getattr(a, "placements", None))
        return tuple(sig(b) for b in a) if isinstance(a, (list, tuple)) else str(a)

    def counting(func, args, kwargs):
        calls.append((str(func), sig(args), sig(tuple(kwargs.items()))))
        return real(func, args, kwargs)

    monkeypatch.setattr(_common, "_compute_meta", counting)

    def f(x, w):
        h = (x @ w).relu()
        return (h * 2 + 1).sum()

    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("aot_eager")
    run = torch.compile(f, backend=cnt, fullgraph=True, dynamic=True)
    w = torch.randn(8, 4)
    for n in (6, 10):
        x = torch.randn(n, 8)
        xs = distribute(x, MeshRef.local(), [Shard(0)]).requires_grad_(True)
        ref_x = x.clone().requires_grad_(True)
        out = run(xs, w)
        ref = f(ref_x, w)
        torch.testing.assert_close(out.full_tensor(), ref)
        out.backward()
        ref.backward()
        torch.testing.assert_close(xs.grad.full_tensor(), ref_x.grad)
    assert cnt.frame_count == 1
    # dynamo's trace, AOTAutograd's metadata pass and its joint trace run the same ops on the
    # same symbolic sizes: each (op, sizes, placements) is computed once. Before, once per pass.
    repeated = sorted({c for c in calls if calls.count(c) > 1})
    assert calls and not repeated, repeated
