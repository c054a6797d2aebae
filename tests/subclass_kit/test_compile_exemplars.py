"""Every exemplar under torch.compile(fullgraph=True): results equal eager and the dense
(``to_plain``) computation, one frame and zero graph breaks, forward and backward; nesting;
dynamic-shape sweeps; recompiles on meta changes (and only then)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from kit_helpers.compiling import BACKENDS, FAST_BACKENDS, assert_same, compile_counted, graph_breaks
from subclass_kit import WrapperTensor, fallbacks, inner, meta
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor

aten = torch.ops.aten

def _dynamic_axis(backend):
    # Inductor runs static only here (the cache test covers it dynamic); the cheap backends both.
    return [False] if backend == "inductor" else [False, True]


def _params():
    out = []
    for b in BACKENDS:
        for d in _dynamic_axis(b.values[0]):
            out.append(pytest.param(b.values[0], d, id=f"{b.id}-{'dynamic' if d else 'static'}", marks=b.marks))
    return out


def _run(backend, dynamic, fn, make_inputs):
    """Run ``fn`` eagerly and compiled on identical fresh inputs; backprop ``out.sum()`` in both.

    Returns (eager inputs, eager out, compiled inputs, compiled out)."""
    counters.clear()
    compiled, cnt = compile_counted(fn, backend, dynamic=dynamic)
    e_in, c_in = make_inputs(), make_inputs()
    e_out, c_out = fn(*e_in), compiled(*c_in)
    assert cnt.frame_count == 1, cnt.frame_count
    assert graph_breaks() == 0, dict(counters["graph_break"])
    assert_same(c_out, e_out)
    outs_e = e_out if isinstance(e_out, tuple) else (e_out,)
    outs_c = c_out if isinstance(c_out, tuple) else (c_out,)
    sum(o.sum() for o in outs_e).backward()
    sum(o.sum() for o in outs_c).backward()
    for a, b in zip(c_in, e_in):
        if isinstance(b, torch.Tensor) and b.requires_grad:
            assert a.grad is not None
            assert_same(a.grad, b.grad)
    return e_in, e_out, c_in, c_out


def _dense_grads(fn, dense_inputs):
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in dense_inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.sum() for o in outs).backward()
    return out, [t.grad for t in leaves]


# ---- TwoTensor -------------------------------------------------------------------------------


def _two_fn(x, w):
    y = ((x * 2 + 1).sin() @ w).relu().sum(dim=0)
    return y + x.t()[0:3].sum(dim=1)  # a view inside the graph


def _two_inputs():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    return TwoTensor(a, b, requires_grad=True), torch.randn(4, 3, generator=g, requires_grad=True)


@pytest.mark.parametrize("backend, dynamic", _params())
def test_twotensor_forward_backward(backend, dynamic):
    e_in, e_out, c_in, c_out = _run(backend, dynamic, _two_fn, _two_inputs)
    x, w = c_in
    assert type(c_out) is TwoTensor
    # Dense references: TwoTensor runs the computation on each inner tensor.
    for name in ("a", "b"):
        ref, (gx, gw) = _dense_grads(_two_fn, (getattr(x, name), w))
        torch.testing.assert_close(getattr(c_out, name), ref)
        torch.testing.assert_close(getattr(x.grad, name), gx)
        torch.testing.assert_close(getattr(w.grad, name), gw)  # w's grad is a TwoTensor too
    torch.testing.assert_close(c_out.to_plain(), _two_fn(x.to_plain(), w))


# ---- ScaledTensor ----------------------------------------------------------------------------


def _scaled_fn(act, s, b):
    # mm(dense, scaled) and mm(scaled, dense) use the handler; s * 0.5 the to_plain fallback.
    return torch.mm(act, s * 0.5).relu(), torch.mm(s, b)


def _scaled_inputs():
    s0 = ScaledTensor.__samples__()[0]
    g = torch.Generator().manual_seed(3)
    s = ScaledTensor(s0.qdata, s0.scale, dtype=torch.float32, requires_grad=True)
    return torch.randn(3, 16, generator=g, requires_grad=True), s, torch.randn(8, 2, generator=g, requires_grad=True)


@pytest.mark.parametrize("backend, dynamic", _params())
def test_scaledtensor_forward_backward(backend, dynamic):
    e_in, e_out, c_in, c_out = _run(backend, dynamic, _scaled_fn, _scaled_inputs)
    act, s, b = c_in
    assert all(type(o) is torch.Tensor for o in c_out)
    ref, (g_act, g_s, g_b) = _dense_grads(_scaled_fn, (act, s.to_plain(), b))
    for got, want in zip(c_out, ref):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(act.grad, g_act, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s.grad, g_s, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b.grad, g_b, rtol=1e-4, atol=1e-5)


# ---- BlockScaled -----------------------------------------------------------------------------


def _block_fn(act, bs):
    return torch.mm(act, bs).tanh() + bs.sum(0)  # both through the to_plain fallback


def _block_inputs():
    b0 = BlockScaled.__samples__()[-1]  # 70 rows, block 16: a partial last block
    g = torch.Generator().manual_seed(4)
    bs = BlockScaled(b0.qdata, b0.scale, block=16, dtype=torch.float32, requires_grad=True)
    return torch.randn(3, 70, generator=g, requires_grad=True), bs


@pytest.mark.parametrize("backend, dynamic", _params())
def test_blockscaled_forward_backward(backend, dynamic):
    e_in, e_out, c_in, c_out = _run(backend, dynamic, _block_fn, _block_inputs)
    act, bs = c_in
    ref, (g_act, g_bs) = _dense_grads(_block_fn, (act, bs.to_plain()))
    torch.testing.assert_close(c_out, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(act.grad, g_act, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bs.grad, g_bs, rtol=1e-4, atol=1e-5)


# ---- nesting ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_nested_twotensor_of_scaledtensors_compiles(backend):
    s1 = ScaledTensor.__samples__()[0]
    s2 = ScaledTensor.from_float(torch.randn(16, 8, generator=torch.Generator().manual_seed(5)))
    x = TwoTensor(s1, s2)
    assert x.dtype == torch.float32 and type(x.a) is ScaledTensor

    def f(act, x):
        return torch.mm(act, x) * 2

    act = torch.randn(3, 16, requires_grad=True)
    act_c = act.detach().clone().requires_grad_(True)
    counters.clear()
    compiled, cnt = compile_counted(f, backend)
    out = compiled(act_c, x)
    assert cnt.frame_count == 1 and graph_breaks() == 0
    assert type(out) is TwoTensor and type(out.a) is torch.Tensor
    torch.testing.assert_close(out.a, act @ s1.to_plain() * 2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.b, act @ s2.to_plain() * 2, rtol=1e-4, atol=1e-5)
    eager = f(act, x)
    assert_same(out, eager)
    out.sum().backward()
    eager.sum().backward()
    assert_same(act_c.grad, act.grad)
    torch.testing.assert_close(act_c.grad.a, 2 * torch.ones(3, 8) @ s1.to_plain().t(), rtol=1e-4, atol=1e-5)


# ---- dynamic shapes and recompiles -----------------------------------------------------------


def test_mark_dynamic_sweep_compiles_once():
    compiled, cnt = compile_counted(lambda x: (x * 2).sum(0) + x[0], "aot_eager")
    for rows in range(2, 9):
        x = TwoTensor(torch.randn(rows, 4), torch.randn(rows, 4))
        torch._dynamo.mark_dynamic(x, 0)
        out = compiled(x)
        torch.testing.assert_close(out.a, (x.a * 2).sum(0) + x.a[0])
        torch.testing.assert_close(out.b, (x.b * 2).sum(0) + x.b[0])
    assert cnt.frame_count == 1


class Scaled1(WrapperTensor):
    """A meta value that changes the answer but no inner shape: only the ctx guard can catch it."""

    val: torch.Tensor = inner()
    k: int = meta(default=1)
    __fallback__ = fallbacks.to_plain

    def to_plain(self):
        return self.val * self.k


def test_changing_a_meta_value_recompiles_and_nothing_changed_reuses():
    compiled, cnt = compile_counted(lambda x: torch.sin(x) + 1, "aot_eager")
    v = torch.randn(4, 3)
    for k, frames in [(2, 1), (2, 1), (3, 2), (2, 2), (3, 2)]:
        x = Scaled1(v + k, k=k)  # new values every call: values never recompile
        torch.testing.assert_close(compiled(x), torch.sin((v + k) * k) + 1)
        assert cnt.frame_count == frames, (k, cnt.frame_count)


def test_changing_block_recompiles_blockscaled():
    compiled, cnt = compile_counted(lambda x, w: torch.mm(x, w), "aot_eager")
    w = torch.randn(8, 2)
    base = torch.randn(64, 8)
    for block, frames in [(32, 1), (16, 2), (32, 2)]:
        x = BlockScaled.from_float(base, block=block)
        torch.testing.assert_close(compiled(x, w), x.to_plain() @ w)
        assert cnt.frame_count == frames
    # Same block, new values: reused.
    x = BlockScaled.from_float(torch.randn(64, 8), block=16)
    torch.testing.assert_close(compiled(x, w), x.to_plain() @ w)
    assert cnt.frame_count == 2


def test_construction_inside_a_dynamic_graph_does_not_specialize():
    """__inner_shapes__ is checked with torch._check on SymInts: one graph for many sizes."""

    def f(q, s):
        return BlockScaled(q, s, block=16, dtype=torch.float32).to_plain()

    compiled, cnt = compile_counted(f, "aot_eager", dynamic=True)
    for rows in (70, 50, 64, 33):
        b = BlockScaled.from_float(torch.randn(rows, 8), block=16)
        torch.testing.assert_close(compiled(b.qdata, b.scale), b.to_plain())
    assert cnt.frame_count == 1
    # A contradicting shape still fails, at trace time, naming the field.
    b = BlockScaled.from_float(torch.randn(70, 8), block=16)
    with pytest.raises(Exception, match=r"BlockScaled\.scale\.size\(0\)"):
        torch.compile(f, backend="eager", fullgraph=True, dynamic=True)(b.qdata, b.scale[:2])
