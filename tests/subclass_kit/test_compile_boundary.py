"""``subclass_kit.compile``: values equal eager through the boundary for every exemplar; a ctx,
dtype or layout change compiles anew (never reuses); side effects once; autograd falls back
with dense-equal gradients; kwargs, non-tensor and nested arguments; views keep aliasing;
``explain`` names the field that changed. Compiles are counted with dynamo's counter."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import subclass_kit
from kit_helpers.compiling import assert_same, storage_id
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor


def _two(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TwoTensor(torch.randn(*shape, generator=g), torch.randn(*shape, generator=g))


def _counted(fn, backend="aot_eager", **kw):
    cnt = CompileCounterWithBackend(backend)
    return subclass_kit.compile(fn, backend=cnt, **kw), cnt


_EXEMPLARS = [
    pytest.param(lambda: (_two(8, 4), _two(8, 4, seed=1)), lambda x, y: x * y + x, id="TwoTensor"),
    pytest.param(lambda: (ScaledTensor.from_float(torch.randn(8, 4)), torch.randn(4, 3)),
                 lambda w, a: w.t().t() @ a, id="ScaledTensor"),
    pytest.param(lambda: (BlockScaled.from_float(torch.randn(64, 2), block=32), torch.randn(64, 2)),
                 lambda w, a: w * a + 1, id="BlockScaled"),
]


@pytest.mark.parametrize("make,fn", _EXEMPLARS)
def test_values_equal_eager_for_every_exemplar(make, fn):
    f, cnt = _counted(fn)
    args = make()
    with torch.no_grad():
        for _ in range(3):
            assert_same(f(*args), fn(*args))
    assert cnt.frame_count == 1
    assert f.fallback_calls == 0


def test_ctx_dtype_and_layout_changes_compile_anew_never_reuse():
    f, cnt = _counted(lambda w: w * 2)
    b32 = BlockScaled.from_float(torch.randn(64, 2), block=32)
    b16 = BlockScaled.from_float(torch.randn(64, 2), block=16)
    b64 = BlockScaled.from_float(torch.randn(64, 2, dtype=torch.float64), block=32)
    x = _two(4, 6)
    with torch.no_grad():
        for w in (b32, b16, b64, b32, b16):
            assert_same(f(w), w * 2)
        assert cnt.frame_count == 3
        f(x)
        out = f(x.t())  # the same ctx, a transposed outer layout
        assert_same(out, x.t() * 2)
        assert out.stride() == (x.t() * 2).stride()
    assert cnt.frame_count == 5
    assert len(f) == 5 and f.fallback_calls == 0


def test_explain_names_the_field_that_changed():
    f, _ = _counted(lambda w: w * 2)
    with torch.no_grad():
        f(BlockScaled.from_float(torch.randn(64, 2), block=32))
    assert f.explain(BlockScaled.from_float(torch.randn(64, 2), block=16)) == [
        "artifact 0: args[0]: ctx.block: expected 32, got 16"]
    assert f.explain(BlockScaled.from_float(torch.randn(64, 2, dtype=torch.float64))) == [
        "artifact 0: args[0]: dtype: expected torch.float32, got torch.float64"]
    assert f.explain(BlockScaled.from_float(torch.randn(32, 2))) == [
        "artifact 0: args[0].size(): expected (64, 2), got (32, 2)"]
    assert f.explain(_two(2)) == ["artifact 0: args[0]: type: expected BlockScaled, got TwoTensor"]
    assert f.explain(BlockScaled.from_float(torch.randn(64, 2))) == ["artifact 0: accepts"]


def test_side_effects_happen_once_per_call():
    calls = []

    def fn(x, y):
        calls.append(1)
        return x + y

    f, _ = _counted(fn)
    x, y = _two(3), _two(3, seed=1)
    with torch.no_grad():
        for n in range(1, 4):
            f(x, y)
            assert len(calls) == n


def test_autograd_falls_back_with_dense_equal_gradients():
    f, _ = _counted(lambda w, a: (w * a).sum())
    dense = torch.randn(8, 4)
    w = TwoTensor(dense.clone(), dense.clone()).requires_grad_(True)
    a = torch.randn(8, 4)
    out = f(w, a)
    assert f.fallback_calls == 1
    assert f.explain(w, a)[0].startswith("artifact 0: accepts, falls back to torch.compile: autograd: args[0] requires grad")
    out.backward()
    ref = dense.clone().requires_grad_(True)
    (ref * a).sum().backward()
    torch.testing.assert_close(w.grad.a, ref.grad)
    torch.testing.assert_close(w.grad.b, ref.grad)
    with torch.no_grad():  # the same wrapper served by the boundary once grad mode is off
        assert_same(f(w, a), (w * a).sum())
    assert f.fallback_calls == 1


def test_kwargs_values_and_nested_arguments():
    def fn(xs, *, scale, mode="add", extra=None):
        y = xs["a"] * scale
        return {"sum": y + xs["b"][0] if mode == "add" else y - xs["b"][0], "n": len(xs["b"])}

    f, cnt = _counted(fn)
    nested = TwoTensor(_two(4), _two(4, seed=1))  # a wrapper of wrappers
    xs = {"a": _two(4, seed=2), "b": [nested, 3]}
    with torch.no_grad():
        assert_same(f(xs, scale=2.0)["sum"], fn(xs, scale=2.0)["sum"])
        assert f(xs, scale=2.0)["n"] == 2
        assert cnt.frame_count == 1
        assert_same(f(xs, scale=3.0, mode="sub")["sum"], fn(xs, scale=3.0, mode="sub")["sum"])
        assert cnt.frame_count == 2
    assert f.explain(xs, scale=4.0) == [
        "artifact 0: kwargs['scale']: expected 2.0, got 4.0",
        "artifact 1: kwargs['scale']: expected 3.0, got 4.0",
    ]
    out = f(xs, scale=2.0)["sum"]
    assert type(out) is TwoTensor and type(out.a) is TwoTensor


def test_a_returned_view_keeps_its_aliasing():
    f, _ = _counted(lambda x: (x.t(), x, x.a[0]))
    x = _two(3, 4)
    with torch.no_grad():
        for _ in range(2):
            v, same, row = f(x)
            assert same is x
            assert storage_id(v) == storage_id(x)  # wrapper-level, as the kit's view handler
            assert storage_id(v.a) == storage_id(x.a) and storage_id(row) == storage_id(x.a)
            x.a.add_(1)
            assert_same(v, x.t())


def test_a_module_with_wrapper_weights():
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)])
    for lin in m:
        lin.weight = torch.nn.Parameter(ScaledTensor.from_float(lin.weight.detach()), requires_grad=False)
    f, cnt = _counted(m)
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert_same(f(x), m(x))
        m[1].weight = torch.nn.Parameter(ScaledTensor.from_float(torch.randn(8, 8)), requires_grad=False)
        assert_same(f(x), m(x))  # a reassigned weight is picked up (same signature: no compile)
    assert cnt.frame_count == 1
    out = f(x)  # grad mode: the plain biases require grad, the output carries it
    out.sum().backward()
    assert m[0].bias.grad is not None and f.fallback_calls == 0


def test_foreign_and_unhashable_arguments_fall_back():
    f, _ = _counted(lambda x, v: x * len(v))
    x = _two(2)
    with torch.no_grad():
        assert_same(f(x, {1, 2}), x * 2)  # a set: no key can hold it
    assert f.fallback_calls == 1
    assert f.explain(x, {1, 2})[0].startswith("falls back to torch.compile: an argument is not hashable")
    TorchTwo = subclass_kit._compat.torch_two_tensor()
    t = TorchTwo(torch.ones(2), torch.zeros(2))
    with torch.no_grad():
        out = f(t, (1,))
    assert type(out) is TorchTwo and f.fallback_calls == 2
    assert f.explain(t, (1,)) == [
        "falls back to torch.compile: args[0] is a TwoTensor, neither a plain tensor nor a kit wrapper "
        "(torch.compile takes it as it is)"]


def test_limit_evicts_the_least_recently_used():
    f, _ = _counted(lambda x: x + 1, limit=2)
    with torch.no_grad(), pytest.warns(Warning, match="limit of 2"):
        for n in (2, 3, 4, 2):
            f(_two(n))
    assert len(f) == 2 and f.evictions == 2


@pytest.mark.slow
def test_inductor_values_equal_eager():
    fn = lambda x, y: x * y + x  # noqa: E731
    f = subclass_kit.compile(fn)
    x, y = _two(16, 16), _two(16, 16, seed=1)
    with torch.no_grad():
        assert_same(f(x, y), fn(x, y))
        assert_same(f(x, y), fn(x, y))
    assert f.fallback_calls == 0 and len(f) == 1


# ---- the direct call: dynamo's artifact run without its frame entry, its guards kept --------
_SCALE = 2.0


def _scaled(x):
    return x * _SCALE


def test_direct_calls_keep_dynamos_guards_and_follow_a_reset():
    global _SCALE
    f, cnt = _counted(_scaled)
    x = _two(4, 3)
    with torch.no_grad():
        for _ in range(2):
            assert_same(f(x), x * 2.0)
        (entry,) = [e for b in f._table.values() for e in b]
        assert entry.direct is not None and len(entry.direct.runs) == 1  # armed: served directly
        try:
            _SCALE = 3.0  # read by the trace: dynamo's guard on it fails, dynamo recompiles
            assert_same(f(x), x * 3.0)
            assert cnt.frame_count == 2
            assert_same(f(x), x * 3.0)
        finally:
            _SCALE = 2.0
        assert_same(f(x), x * 2.0)  # dynamo's first entry again, its guard passes
        assert cnt.frame_count == 2
        torch._dynamo.reset()  # dynamo drops its artifacts: not served from them any more
        assert_same(f(x), x * 2.0)
        assert cnt.frame_count == 3
    assert f.fallback_calls == 0


def test_direct_calls_keep_aliasing_graph_breaks_and_stance():
    f, cnt = _counted(lambda x, y: x * y + x)
    x, y = _two(4, 3), _two(4, 3, seed=1)
    with torch.no_grad():
        assert_same(f(x, x), x * x + x)  # one wrapper twice: dynamo's graph takes it once
        assert_same(f(x, y), x * y + x)  # same key and layouts: dynamo's aliasing guard tells
        assert cnt.frame_count == 2
        with torch.compiler.set_stance("force_eager"):
            assert_same(f(x, y), x * y + x)
        assert cnt.frame_count == 2

    def broken(x):
        torch._dynamo.graph_break()
        return x + 1

    g, cnt = _counted(broken)
    with torch.no_grad():
        for _ in range(2):
            assert_same(g(x), x + 1)
    (entry,) = [e for b in g._table.values() for e in b]
    assert entry.direct is not None and entry.direct.runs == ()  # a resume function: dynamo's path


def test_guard_collectives_keep_dynamos_path(monkeypatch):
    # With guard collectives on, every guard evaluation goes through torch's hook (an
    # all-gather across ranks when a guard group is set): the boundary must not skip it.
    from torch._dynamo import eval_frame

    seen = []
    real = eval_frame.guard_collectives_hook
    monkeypatch.setattr(eval_frame, "guard_collectives_hook", lambda ok: seen.append(ok) or real(ok))
    f, cnt = _counted(lambda x: x * 2)
    x = _two(4, 3)
    with torch.no_grad():
        f(x)
        f(x)  # armed for direct calls
        assert torch.compiler.set_enable_guard_collectives(True) is False
        try:
            for _ in range(3):
                assert_same(f(x), x * 2)
        finally:
            torch.compiler.set_enable_guard_collectives(False)
        assert seen == [True, True, True] and cnt.frame_count == 1
        assert_same(f(x), x * 2)  # off again: direct, the hook is not consulted
    assert seen == [True, True, True]


def test_a_module_is_called_through_a_twin_and_left_untouched():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    for i in (0, 2):
        m[i].weight = torch.nn.Parameter(ScaledTensor.from_float(m[i].weight.detach()), requires_grad=False)
    weights = [m[0].weight, m[2].weight]
    f, cnt = _counted(m)
    x = torch.randn(2, 8)
    with torch.no_grad():
        for _ in range(2):
            assert_same(f(x), m(x))
        assert [m[0].weight, m[2].weight] == weights and type(m[0]) is torch.nn.Linear  # noqa: E721
        m[0].bias = torch.nn.Parameter(torch.randn(8))  # a plain parameter: read live
        assert_same(f(x), m(x))
        m[2] = torch.nn.Linear(8, 8)  # a new child: planned again
        m[2].weight = torch.nn.Parameter(ScaledTensor.from_float(torch.randn(8, 8)), requires_grad=False)
        assert_same(f(x), m(x))
        m.append(torch.nn.Tanh())  # a child added to the root: the twin's children are live
        assert_same(f(x), m(x))
    assert f.fallback_calls == 0


class _MatWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(_two(4, 6, seed=2), requires_grad=False)

    def forward(self, x):
        return x @ self.w


def test_a_parameter_relaid_in_place_is_picked_up():
    m = _MatWeight()
    f, cnt = _counted(m)
    x, x2 = _two(3, 4), _two(3, 6)
    with torch.no_grad():
        assert_same(f(x), m(x))
        m.w.t_()  # the same wrapper, its layout changed in place: (4, 6) -> (6, 4)
        assert_same(f(x2), m(x2))
        assert cnt.frame_count == 2
        m.w.t_()
        assert_same(f(x), m(x))  # back to the first layout and its artifact
    assert cnt.frame_count == 2 and f.fallback_calls == 0
