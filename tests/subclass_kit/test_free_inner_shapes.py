"""Inner tensors whose shape the outer size does not determine (issue 23, item 4).

An inner field that ``__inner_shapes__`` leaves out has a free shape, as any inner tensor
may in torch. PyTorch's own subclass tests (test/dynamo/test_subclasses.py) have such
classes; these are their cases ported to the kit, each compiled for real and counted.
On the main branch before this change every class here failed at construction with
``InnerShapesKeyError``.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import guards
import symbolic
from subclass_kit import InnerShapesKeyError, WrapperTensor, inner, meta
from symbolic import Dim

aten = torch.ops.aten


class FreeScale(WrapperTensor):
    """torch's test ``ScaledTensor``: data of the outer shape, a 1-D scale of any length."""

    payload: torch.Tensor = inner()
    scale: torch.Tensor = inner()
    constant: int = meta(default=0)

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"payload": tuple(outer_size)}  # scale left out: its shape is free


@FreeScale.implements(aten.sin.default)
def _sin(func, types, args, kwargs):
    x = args[0]
    return FreeScale(func(x.payload), x.scale, constant=x.constant)


class OptionalFreeScale(WrapperTensor):
    """torch's ``OptionalScaledTensor``: the scale may be absent, and is free when present."""

    payload: torch.Tensor = inner()
    scale: torch.Tensor = inner(optional=True)

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"payload": tuple(outer_size)}


@OptionalFreeScale.implements(aten.add.Tensor)
def _add(func, types, args, kwargs):
    x, other = args
    out = func(x.payload, other)
    if x.scale is not None:
        out = out * x.scale.sum()
    return OptionalFreeScale(out, x.scale)


class Nested(WrapperTensor):
    """Two wrappers of different sizes inside one: ``first`` has the outer shape, ``second``
    (and its own scale) are free."""

    first: torch.Tensor = inner()
    second: torch.Tensor = inner()

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"first": tuple(outer_size)}


def _sin_fn(a):
    return a.sin()


def _compiles(fn, inputs, *, dynamic):
    cnt = CompileCounterWithBackend("eager")
    f = torch.compile(fn, backend=cnt, fullgraph=True, dynamic=dynamic)
    for args in inputs:
        got = f(*args)
        want = fn(*args)
        got_t = got.payload if isinstance(got, WrapperTensor) else got
        want_t = want.payload if isinstance(want, WrapperTensor) else want
        torch.testing.assert_close(got_t, want_t)
    return cnt.frame_count


def test_a_free_inner_tensor_may_have_any_shape():
    for scale in (torch.randn(6), torch.randn(3, 7), torch.randn(())):
        x = FreeScale(torch.randn(2, 4), scale)
        assert x.scale is scale and tuple(x.shape) == (2, 4)
    assert symbolic.relations(FreeScale(torch.randn(2, 4), torch.randn(2))) == [
        sympy_eq("payload", 0, "s0"), sympy_eq("payload", 1, "s1")]
    with pytest.raises(InnerShapesKeyError, match="'scales' is not an inner field"):
        type("Typo", (FreeScale,), {"__inner_shapes__": classmethod(
            lambda cls, size, ctx: {"payload": tuple(size), "scales": (1,)}), "__module__": __name__})(
            torch.randn(2, 4), torch.randn(6))


def sympy_eq(path, dim, outer):
    import sympy

    return sympy.Eq(symbolic.size_symbol(path, dim), sympy.Symbol(outer, integer=True, positive=True))


def test_wrapper_subclass_with_same_sized_inner_tensor():
    # dynamic=True: a new data size and a new scale size share one graph.
    assert _compiles(_sin_fn, [(FreeScale(torch.randn(2, 4), torch.randn(6)),),
                               (FreeScale(torch.randn(3, 5), torch.randn(7)),)], dynamic=True) == 1
    # dynamic=False: a new data size recompiles.
    assert _compiles(_sin_fn, [(FreeScale(torch.randn(2, 4), torch.randn(6)),),
                               (FreeScale(torch.randn(3, 5), torch.randn(6)),)], dynamic=False) == 2
    # mark_dynamic on the outer dims reaches the inner tensor of the outer shape.
    sub1 = FreeScale(torch.randn(2, 4), torch.randn(6))
    torch._dynamo.mark_dynamic(sub1, 0)
    torch._dynamo.mark_dynamic(sub1, 1)
    assert symbolic.marks(sub1).inner == {"payload": {0: Dim.dynamic(), 1: Dim.dynamic()}}
    assert _compiles(_sin_fn, [(sub1,), (FreeScale(torch.randn(3, 5), torch.randn(6)),)], dynamic=False) == 1


def test_wrapper_subclass_with_differently_sized_inner_tensor():
    # dynamic=False: a new scale size recompiles.
    assert _compiles(_sin_fn, [(FreeScale(torch.randn(2, 4), torch.randn(3)),),
                               (FreeScale(torch.randn(2, 4), torch.randn(5)),)], dynamic=False) == 2
    # Marking the outer dims does not reach a free inner tensor: still a recompile.
    sub1 = FreeScale(torch.randn(2, 4), torch.randn(3))
    torch._dynamo.mark_dynamic(sub1, 0)
    torch._dynamo.mark_dynamic(sub1, 1)
    assert "scale" not in symbolic.marks(sub1).inner
    assert _compiles(_sin_fn, [(sub1,), (FreeScale(torch.randn(2, 4), torch.randn(5)),)], dynamic=False) == 2
    # The kit's guards predict what dynamo did.
    report = guards.explain_recompiles(_sin_fn, [(FreeScale(torch.randn(2, 4), torch.randn(3)),),
                                                 (FreeScale(torch.randn(2, 4), torch.randn(5)),)],
                                       dynamic=False)
    assert [c.compiled for c in report.calls] == [True, True] and report.agrees


def test_recompiles_with_optional_free_inner_tensor():
    def f(x):
        return x + 1

    with_scale = (OptionalFreeScale(torch.randn(2, 4), torch.randn(5)),)
    without = (OptionalFreeScale(torch.randn(2, 4), None),)
    assert _compiles(f, [without, without], dynamic=False) == 1
    assert _compiles(f, [without, with_scale], dynamic=False) == 2
    report = guards.explain_recompiles(f, [without, with_scale, with_scale], dynamic=False)
    assert [c.compiled for c in report.calls] == [True, True, False] and report.agrees


def _nested(rows, other_rows):
    g = torch.Generator().manual_seed(rows * 100 + other_rows)
    first = FreeScale(torch.randn(rows, 4, generator=g), torch.randn(11, generator=g))
    second = FreeScale(torch.randn(other_rows, 4, generator=g), torch.randn(other_rows + 1, generator=g))
    return Nested(first, second)


def _nested_fn(x):
    return x.first.payload.sum(0) + x.second.payload.sum(0) * x.second.scale.sum()


def test_nested_wrappers_of_different_sizes():
    x = _nested(3, 5)
    assert tuple(x.shape) == (3, 4) and tuple(x.second.shape) == (5, 4)
    # dynamic=True: one graph for every combination of sizes.
    inputs = [(_nested(r, o),) for r, o in ((3, 5), (4, 7), (6, 2))]
    assert _compiles(_nested_fn, inputs, dynamic=True) == 1
    # Marking the outer dim derives the first wrapper's marks and leaves the free one alone.
    y = _nested(3, 5)
    torch._dynamo.mark_dynamic(y, 0)
    p = symbolic.marks(y)
    assert "second" not in p.inner and p.inner["first"].inner == {"payload": {0: Dim.dynamic()}}
    assert _compiles(_nested_fn, [(y,), (_nested(4, 5),), (_nested(9, 5),)], dynamic=False) == 1
    report = guards.explain_recompiles(_nested_fn, [(_nested(3, 5),), (_nested(3, 6),)], dynamic=False)
    assert [c.compiled for c in report.calls] == [True, True] and report.agrees
