"""``ScaledTensor`` under ``F.linear``: the transpose is a column-scaled view, and the matmul of
float32 activations by it is one ``_weight_int8pack_mm`` (the weight never dequantized), in
eager and in the compiled graph; values equal the dense reference; gradients of the
activations equal dense ones."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import AotEagerAndRecordGraphs

import subclass_kit
from subclass_kit.examples import ScaledTensor

aten = torch.ops.aten


def _w(rows=8, cols=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ScaledTensor.from_float(torch.randn(rows, cols, generator=g))


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_transpose_is_a_column_scaled_view_of_the_same_data():
    w = _w()
    t = w.t()
    assert type(t) is ScaledTensor and t.granularity == "col" and tuple(t.scale.shape) == (1, 8)
    assert t.qdata.data_ptr() == w.qdata.data_ptr()
    assert t.untyped_storage()._cdata == w.untyped_storage()._cdata  # a view, as for a dense t
    _close(t.to_plain(), w.to_plain().t())
    back = t.t()
    assert back.granularity == "row"
    _close(back.to_plain(), w.to_plain())
    # A weight that takes part in autograd keeps the dense transpose (op results are dense).
    wg = ScaledTensor(w.qdata, w.scale, dtype=torch.float32, requires_grad=True)
    assert type(wg.t()) is torch.Tensor


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (4,)], ids=["2d", "3d", "1d"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_linear_equals_the_dense_reference(shape, bias):
    w = _w()
    x = torch.randn(*shape)
    b = torch.randn(8) if bias else None
    _close(F.linear(x, w, b), F.linear(x, w.to_plain(), b))
    # Activations by a column-scaled matrix and a column-scaled matrix by activations.
    a = torch.randn(5, 8)
    _close(a @ w.t().t(), a @ w.to_plain())
    m = torch.randn(8, 2)
    _close(w.t() @ m, w.to_plain().t() @ m)


def test_addmm_with_beta_alpha_and_float64_keep_the_dense_meaning():
    w = _w()
    c, a = torch.randn(3, 8), torch.randn(3, 4)
    _close(torch.addmm(c, a, w.t(), beta=0.5, alpha=2.0), torch.addmm(c, a, w.to_plain().t(), beta=0.5, alpha=2.0))
    w64 = ScaledTensor.from_float(torch.randn(8, 4, dtype=torch.float64))  # the kernel takes float32 only
    a64 = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(F.linear(a64, w64), a64 @ w64.to_plain().t())


def test_activation_gradients_equal_dense_ones():
    w, b = _w(), torch.randn(8)
    x = torch.randn(3, 4, requires_grad=True)
    xd = x.detach().clone().requires_grad_()
    F.linear(x, w, b).square().sum().backward()
    F.linear(xd, w.to_plain(), b).square().sum().backward()
    _close(x.grad, xd.grad)


def test_the_compiled_graph_runs_the_int8_kernel_not_a_dequantized_weight():
    lin = torch.nn.Linear(4, 8).eval()
    lin.weight = torch.nn.Parameter(_w(), requires_grad=False)
    x = torch.randn(3, 4)
    for compile_ in (torch.compile, subclass_kit.compile):
        rec = AotEagerAndRecordGraphs()
        f = compile_(lin, backend=rec, fullgraph=True)
        with torch.no_grad():
            _close(f(x), F.linear(x, lin.weight.to_plain(), lin.bias))
        ops = {n.target for g in rec.fw_graphs for n in g.graph.nodes if n.op == "call_function"}
        assert aten._weight_int8pack_mm.default in ops, ops
        assert aten._to_copy.default not in ops, ops  # no int8 -> float32 copy of the weight


@pytest.mark.slow
def test_inductor_quantized_model_through_the_boundary_equals_eager():
    from subclass_kit.bench._boundary_bench import quantized_model

    plain, kit = quantized_model(layers=3, width=16)
    f = subclass_kit.compile(kit, backend="inductor", fullgraph=True)
    x = torch.randn(2, 16)
    with torch.no_grad():
        for _ in range(2):
            _close(f(x), kit(x))
    assert f.fallback_calls == 0
