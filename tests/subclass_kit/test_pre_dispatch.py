"""Wrappers built inside torch.export's tracing (subclass_kit/pre_dispatch.py).

The parametrization path (torch's ``unwrap_tensor_subclass_parameters``, which torchao's
``unwrap_tensor_subclass`` takes) rebuilds each weight with ``__tensor_unflatten__`` in
every forward. Before the kit recorded that construction, non-strict export failed with
``Unable to cast NotImplemented to Tensor`` and strict export with a dynamo graph break
on ``storage_offset``. Export only here (cheap); AOTInductor is in tests/deploy.
"""

from __future__ import annotations

import enum

import pytest
import torch

from subclass_kit import WrapperTensor, fallbacks, inner, meta
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor
from subclass_kit._compat import unwrap_tensor_subclass_parameters

_MAKERS = {
    "TwoTensor": lambda w: TwoTensor(w.clone(), w * 2),
    "ScaledTensor": lambda w: ScaledTensor.from_float(w),
    "BlockScaled": lambda w: BlockScaled.from_float(w, block=16),
}


class _Linear(torch.nn.Module):
    """nn.Linear with a wrapped weight; returns a plain tensor (to_plain on a wrapped output)."""

    def __init__(self, make):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.lin = torch.nn.Linear(24, 40)
        self.lin.weight = torch.nn.Parameter(make(torch.randn(40, 24, generator=g)), requires_grad=False)

    def forward(self, x):
        y = self.lin(x)
        return y.to_plain() if isinstance(y, WrapperTensor) else y


def _export(m, strict):
    x = torch.randn(5, 24)
    return torch.export.export(m, (x,), strict=strict, dynamic_shapes=({0: torch.export.Dim("batch", min=2, max=64)},))


def _targets(ep):
    return [n.target for n in ep.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
@pytest.mark.parametrize("name", list(_MAKERS))
def test_parametrized_export_matches_eager(name, strict):
    m = unwrap_tensor_subclass_parameters(_Linear(_MAKERS[name]))
    assert not any(isinstance(p, WrapperTensor) for p in m.parameters())
    ep = _export(m, strict)
    # The weight is rebuilt in the graph from the plain parameters, once per forward.
    assert torch.ops.higher_order.flat_apply in _targets(ep)
    run = ep.module()
    for b in (3, 17):  # the batch dim stays dynamic
        x = torch.randn(b, 24)
        torch.testing.assert_close(run(x), m(x), rtol=0, atol=0)


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_to_plain_of_a_wrapped_output_is_one_op(strict):
    # TwoTensor's linear returns a TwoTensor; to_plain() reads an inner tensor, which the
    # tracer only knows through the recorded op.
    m = unwrap_tensor_subclass_parameters(_Linear(_MAKERS["TwoTensor"]))
    ep = _export(m, strict)
    assert torch.ops.subclass_kit.to_plain.default in _targets(ep)
    x = torch.randn(7, 24)
    out = ep.module()(x)
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, m(x), rtol=0, atol=0)


class Mode(enum.Enum):
    FAST = "fast"


class Tagged(WrapperTensor):
    """A user class whose meta value is not a graph-representable constant (an Enum)."""

    payload: torch.Tensor = inner()
    speed: Mode = meta(default=Mode.FAST)
    __fallback__ = fallbacks.map_inner

    def to_plain(self):
        return self.payload


class _BuildsInForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 8), requires_grad=False)

    def forward(self, x):
        q = BlockScaled.from_float(self.w, block=4)  # constructor + from_parts inside forward
        t = Tagged(x * 2)
        return torch.nn.functional.linear(x, q) + (t + 1).to_plain().sum(1, keepdim=True)


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_wrappers_built_in_forward(strict):
    m = _BuildsInForward()
    x = torch.randn(4, 8)
    ep = torch.export.export(m, (x,), strict=strict, dynamic_shapes=({0: torch.export.Dim("batch", min=2, max=64)},))
    x2 = torch.randn(9, 8)
    torch.testing.assert_close(ep.module()(x2), m(x2), rtol=0, atol=0)


def test_outside_export_nothing_is_recorded():
    # Another torch-function mode (a device context) is active, but no export: to_plain and
    # construction behave as in plain eager.
    with torch.device("cpu"):
        x = TwoTensor(torch.ones(2), torch.zeros(2))
        assert x.to_plain() is x.a
