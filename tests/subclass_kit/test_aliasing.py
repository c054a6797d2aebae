"""Aliasing: views share storage with their input (outer and inner), in-place ops return the
same object, and detach / alias / clone / _to_copy / copy_ behave as for plain tensors."""

from __future__ import annotations

import pytest
import torch

from kit_helpers.compiling import compile_counted, storage_id
from subclass_kit import WrapperTensor, inner
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor

aten = torch.ops.aten


class Pairish(WrapperTensor):
    """Outer-shaped, default (raising) fallback: only built-ins work."""

    left: torch.Tensor = inner()
    right: torch.Tensor = inner()


def _two(*shape):
    return TwoTensor(torch.randn(*shape), torch.randn(*shape))


VIEWS = [
    pytest.param(lambda x: x.view(-1), id="view"),
    pytest.param(lambda x: x.t(), id="t"),
    pytest.param(lambda x: x.transpose(0, 1), id="transpose"),
    pytest.param(lambda x: x[1], id="select"),
    pytest.param(lambda x: x[:, 1:], id="slice"),
    pytest.param(lambda x: x.unsqueeze(0), id="unsqueeze"),
    pytest.param(lambda x: x.expand(2, 3, 4), id="expand"),
    pytest.param(lambda x: x.unbind(0)[2], id="unbind"),
    pytest.param(lambda x: x.split(1, dim=0)[1], id="split"),
    pytest.param(lambda x: x.as_strided((2, 2), (1, 4)), id="as_strided"),
]


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("cls", [TwoTensor, Pairish], ids=["TwoTensor", "no-fallback"])
def test_views_share_storage_outer_and_inner(cls, view):
    x = cls(torch.randn(3, 4), torch.randn(3, 4))
    names = x.__tensor_flatten__()[0]
    y = view(x)
    assert type(y) is cls
    # Outer: the view aliases its input, as torch's schema says it must.
    assert storage_id(y) == storage_id(x)
    assert y._is_view() and y._base is x
    # Inner: every inner tensor is the same view of the matching inner tensor.
    for n in names:
        yi, xi = getattr(y, n), getattr(x, n)
        assert yi.untyped_storage().data_ptr() == xi.untyped_storage().data_ptr()
        assert torch.equal(yi, view(xi))
        assert yi.stride() == view(xi).stride()
    assert y.shape == view(x.__dict__[names[0]]).shape and y.stride() == getattr(y, names[0]).stride()


def test_writes_through_a_view_reach_the_base():
    x = _two(3, 4)
    a0, b0 = x.a.clone(), x.b.clone()
    x.t()[1].add_(10)  # column 1 of x
    expected_a, expected_b = a0.clone(), b0.clone()
    expected_a[:, 1] += 10
    expected_b[:, 1] += 10
    assert torch.equal(x.a, expected_a) and torch.equal(x.b, expected_b)


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda x: x.add_(1), id="add_"),
        pytest.param(lambda x: x.mul_(torch.full((4,), 2.0)), id="mul_-broadcast"),
        pytest.param(lambda x: x.zero_(), id="zero_"),
        pytest.param(lambda x: x.clamp_(min=0), id="clamp_"),
        pytest.param(lambda x: x.t_(), id="t_"),
        pytest.param(lambda x: x.unsqueeze_(0), id="unsqueeze_"),
    ],
)
def test_in_place_returns_the_same_object_and_mutates_inners(op):
    x = _two(3, 4)
    a0, b0 = x.a.clone(), x.b.clone()
    out = op(x)
    assert out is x
    assert torch.equal(x.a, op(a0)) and torch.equal(x.b, op(b0))
    assert x.shape == x.a.shape and x.stride() == x.a.stride()


def test_out_variant_returns_the_out_argument():
    x = _two(2, 2)
    out = TwoTensor(torch.empty(2, 2), torch.empty(2, 2))
    r = torch.mul(x, 3, out=out)
    assert r is out
    assert torch.equal(out.a, x.a * 3) and torch.equal(out.b, x.b * 3)


@pytest.mark.parametrize("cls", [TwoTensor, ScaledTensor, BlockScaled, Pairish], ids=lambda c: c.__name__)
def test_detach_and_alias_share_storage_keep_ctx(cls):
    x = cls.__samples__()[0] if hasattr(cls, "__samples__") else cls(torch.randn(2, 3), torch.randn(2, 3))
    names, ctx = x.__tensor_flatten__()
    for op in (lambda t: t.detach(), aten.alias.default):
        y = op(x)
        assert type(y) is cls and y is not x
        assert y.__tensor_flatten__() == (names, ctx)
        assert storage_id(y) == storage_id(x)
        assert y.shape == x.shape and y.stride() == x.stride()
        for n in names:
            assert getattr(y, n).untyped_storage().data_ptr() == getattr(x, n).untyped_storage().data_ptr()


def test_detach_drops_requires_grad():
    x = TwoTensor(torch.ones(2), torch.ones(2), requires_grad=True)
    y = x.detach()
    assert x.requires_grad and not y.requires_grad and not y.a.requires_grad


@pytest.mark.parametrize("cls", [TwoTensor, ScaledTensor, BlockScaled, Pairish], ids=lambda c: c.__name__)
def test_clone_and_to_copy_make_new_storage_with_equal_values(cls):
    x = cls.__samples__()[0] if hasattr(cls, "__samples__") else cls(torch.randn(2, 3), torch.randn(2, 3))
    names, ctx = x.__tensor_flatten__()
    for op in (lambda t: t.clone(), aten._to_copy.default, lambda t: t.to("cpu", copy=True)):
        y = op(x)
        assert type(y) is cls and y.__tensor_flatten__() == (names, ctx)
        assert storage_id(y) != storage_id(x)
        for n in names:
            assert getattr(y, n).data_ptr() != getattr(x, n).data_ptr()
            assert torch.equal(getattr(y, n), getattr(x, n))
    # Same dtype and device: .to is a no-op that returns the very object, as for plain tensors.
    assert x.to(x.dtype) is x and x.to("cpu") is x


def test_clone_of_non_contiguous_keeps_strides_like_torch():
    x = _two(3, 4).t()
    y = x.clone()
    assert y.stride() == x.a.clone().stride() and torch.equal(y.a, x.a)
    z = x.clone(memory_format=torch.contiguous_format)
    assert z.is_contiguous() and z.a.is_contiguous() and torch.equal(z.b, x.b)


def test_dtype_changing_to_copy_goes_to_the_fallback():
    x = _two(2, 2)
    d = x.double()
    assert type(d) is TwoTensor and d.dtype == torch.float64 and d.a.dtype == torch.float64
    s = ScaledTensor.__samples__()[0]
    h = s.to(torch.float64)  # to_plain fallback: dense result
    assert type(h) is torch.Tensor and torch.equal(h, s.to_plain().double())


def test_copy_between_same_class_copies_inners_and_returns_dst():
    src, dst = _two(2, 2), _two(2, 2)
    r = dst.copy_(src)
    assert r is dst and torch.equal(dst.a, src.a) and torch.equal(dst.b, src.b)
    assert dst.a.data_ptr() != src.a.data_ptr()


def test_view_then_in_place_under_compile_matches_eager():
    def f(x):
        v = x.t()
        v.mul_(2)
        return x + 1, v.sum()

    x_eager = _two(3, 4)
    x_comp = TwoTensor(x_eager.a.clone(), x_eager.b.clone())
    expected = f(x_eager)
    compiled, cnt = compile_counted(f, "aot_eager")
    got = compiled(x_comp)
    assert cnt.frame_count == 1
    for g, e in zip(got, expected):
        assert torch.equal(g.a, e.a) and torch.equal(g.b, e.b)
    # The input mutation made inside the graph is applied to the caller's tensor.
    assert torch.equal(x_comp.a, x_eager.a) and torch.equal(x_comp.b, x_eager.b)


@pytest.mark.parametrize("cls", [TwoTensor, ScaledTensor, BlockScaled], ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "op",
    [pytest.param(lambda x: x.detach(), id="detach"), pytest.param(aten.alias.default, id="alias")],
)
def test_compiled_output_aliasing_an_input_keeps_type_and_storage(cls, op):
    """AOTAutograd regenerates an output that aliases an input (as_strided of the input with its
    own size/stride/offset); the wrapper must come back as itself, sharing inner storage."""
    x = cls.__samples__()[0]
    compiled, cnt = compile_counted(op, "aot_eager")
    out = compiled(x)
    assert type(out) is cls and cnt.frame_count == 1
    names, ctx = x.__tensor_flatten__()
    assert out.__tensor_flatten__() == (names, ctx)
    for n in names:
        assert getattr(out, n).untyped_storage().data_ptr() == getattr(x, n).untyped_storage().data_ptr()


def test_compiled_view_of_an_input_is_a_view():
    x = _two(3, 4)
    compiled, _ = compile_counted(lambda x: x.t()[1:], "aot_eager")
    out = compiled(x)
    assert type(out) is TwoTensor and torch.equal(out.a, x.a.t()[1:]) and out.stride() == x.a.t()[1:].stride()
    out.add_(1)  # writes through to the caller's tensor, as in eager
    assert torch.equal(x.a.t()[1:], out.a)


@pytest.mark.parametrize(
    "view",
    [
        pytest.param(lambda x: x[:, -2:].view(torch.int16), id="float-to-int16-slice"),
        pytest.param(lambda x: x.view(torch.int16), id="float-to-int16"),
        pytest.param(lambda x: x.view(torch.int16)[1:, 4:].view(torch.float64), id="int16-to-float64"),
        pytest.param(lambda x: x[1:].view(torch.int32), id="same-size"),
    ],
)
def test_compiled_dtype_view_of_an_input_matches_eager(view):
    # AOTAutograd rebuilds an output view of a wrapper input as as_strided(the output's
    # size, stride, offset).view(its dtype): counted in the output's elements but applied in
    # the input's, wrong across element sizes (torch raised "out of bounds", or gave another
    # shape). Such an output is left unaliased while traced: the graph's own result.
    x = _two(4, 8)
    want = view(x.a)
    compiled, cnt = compile_counted(view, "aot_eager")
    out = compiled(x)
    assert type(out) is TwoTensor and cnt.frame_count == 1
    assert torch.equal(out.a, want) and torch.equal(out.b, view(x.b))
    assert (out.stride(), out.storage_offset()) == (want.stride(), want.storage_offset())
    assert out.a.untyped_storage().data_ptr() == x.a.untyped_storage().data_ptr()  # still x's data
