"""symbolic.describe: one description whether dims come from torch's marks or from a policy."""

import pytest
import sympy
import torch
from torch.testing._internal.two_tensor import TwoTensor as TorchTwoTensor

import symbolic
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor
from symbolic import Dim, SubclassPolicy


def _view(desc):
    return {src.render("x"): (dict(info.dims), dict(info.marks), info.nested, info.refused)
            for src, info in desc.tensors.items()}


@pytest.mark.parametrize("make", [
    lambda: BlockScaled.from_float(torch.randn(64, 8), block=32),
    lambda: TwoTensor(ScaledTensor.from_float(torch.randn(6, 4)), ScaledTensor.from_float(torch.randn(6, 4))),
    lambda: TorchTwoTensor(torch.ones(5, 3), torch.ones(5, 3)),
], ids=["block_scaled", "nested", "torch_two"])
def test_policy_reads_as_the_marks_apply_leaves(make):
    x = make()
    policy = symbolic.plan(x, {0: Dim.dynamic(), 1: Dim.static()})
    predicted = symbolic.describe(make(), policy)
    y = make()
    symbolic.apply(y, policy)
    assert _view(symbolic.describe(y)) == _view(predicted)


def test_nested_wrapper_rule():
    x = TwoTensor(ScaledTensor.from_float(torch.randn(6, 4)), ScaledTensor.from_float(torch.randn(6, 4)))
    d = symbolic.describe(x, SubclassPolicy(outer={0: Dim.dynamic()}, inner={"a": SubclassPolicy(outer={0: Dim.dynamic()})}))
    a = d[symbolic.InnerSource("a")]
    assert a.nested and a.dims == {0: Dim.auto()} and a.refused == ()
    torch._dynamo.mark_dynamic(x.a, 0)  # a strict mark where dynamo refuses one
    assert symbolic.describe(x)[symbolic.InnerSource("a")].refused == (0,)


def test_relations_carry_their_sources():
    x = BlockScaled.from_float(torch.randn(70, 8), block=16)
    (r,) = [r for r in symbolic.describe(x).relations() if r.target.name == "L['x'].scale.size()[0]"]
    s0 = symbolic.size_symbol("", 0)
    assert r.expr == sympy.ceiling(s0 / 16)
    assert r.symbols == {s0: symbolic.SizeSource(symbolic.ROOT, 0)}
    assert r.solve_pinned(5) == {}  # ceiling: many row counts give 5 blocks
    (q,) = [r for r in symbolic.describe(x).relations() if r.target.name == "L['x'].qdata.size()[0]"]
    assert q.solve_pinned(70) == {s0: 70}
    assert symbolic.describe(torch.ones(3)).relations() == []


def test_unbacked_and_bad_policy():
    t = torch.ones(4, 3)
    torch._dynamo.decorators.mark_unbacked(t, 1)
    info = symbolic.describe(t)[symbolic.ROOT]
    assert info.kind(1) == "unbacked" and 1 not in symbolic.marks(t).outer
    with pytest.raises(TypeError, match="SubclassPolicy or a"):
        symbolic.describe(t, policy=[0])
    with pytest.raises(ValueError, match="out of range"):
        symbolic.describe(t, policy={5: Dim.dynamic()})
