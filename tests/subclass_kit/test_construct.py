"""Construction: binding fields, outer-tensor overrides, and the errors users see at construction."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from expecttest import assert_expected_inline

from subclass_kit import ConstructionError, FieldDeclarationError, InnerShapeError, WrapperTensor, fallbacks, inner, meta
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor


class Flat(WrapperTensor):
    """One flat buffer behind a shaped outer tensor: needs size= to construct."""

    buf: torch.Tensor = inner()

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        n = 1
        for s in outer_size:
            n = n * s
        return {"buf": (n,)}


class Opt(WrapperTensor):
    vals: torch.Tensor = inner()
    mask: torch.Tensor = inner(optional=True)
    label: object = meta(default="none")
    __fallback__ = fallbacks.map_inner


class NeedsMeta(WrapperTensor):
    vals: torch.Tensor = inner()
    k: int = meta()


@dataclasses.dataclass(frozen=True)
class Cfg:
    name: str
    factor: int = 2


def _q(rows, cols=4):
    return torch.randint(-5, 5, (rows, cols), dtype=torch.int8)


# ---- binding -------------------------------------------------------------------------------


def test_positional_and_keyword_binding_agree():
    q, s = _q(64), torch.rand(4, 1)
    a = BlockScaled(q, s, 16, dtype=torch.float32)
    b = BlockScaled(qdata=q, scale=s, block=16, dtype=torch.float32)
    c = BlockScaled(q, scale=s, block=16, dtype=torch.float32)
    for x in (a, b, c):
        assert x.block == 16 and x.qdata is q and x.scale is s
        assert x.__tensor_flatten__()[1] == a.__tensor_flatten__()[1]


def test_outer_metadata_defaults_to_the_primary_inner_tensor():
    a = torch.randn(3, 5).t()  # non-contiguous primary
    x = TwoTensor(a, a.clone())
    assert x.shape == a.shape and x.stride() == a.stride() and x.dtype == a.dtype
    assert x.device == a.device and x.requires_grad is False
    assert x.storage_offset() == a.storage_offset()


def test_outer_overrides_size_stride_dtype_device_requires_grad():
    buf = torch.arange(6.0)
    x = Flat(buf, size=(2, 3))
    assert x.shape == (2, 3) and x.stride() == (3, 1)
    y = Flat(buf, size=(2, 3), stride=(1, 2), dtype=torch.float64, requires_grad=True)
    assert y.stride() == (1, 2) and y.dtype == torch.float64 and y.requires_grad
    assert y.__tensor_flatten__()[1].dtype == torch.float64
    z = Flat(buf, size=(2, 3), device="cpu")
    assert z.device == torch.device("cpu")
    # The outer dtype of the exemplar differs from the primary's (int8 data, float outer).
    s = ScaledTensor(_q(3), torch.rand(3, 1), dtype=torch.float32)
    assert s.dtype == torch.float32 and s.qdata.dtype == torch.int8


def test_optional_inner_absent_is_left_out_of_flatten():
    x = Opt(torch.ones(2))
    names, ctx = x.__tensor_flatten__()
    assert names == ["vals"] and ctx.present == ("vals",)
    assert x.mask is None
    y = Opt(torch.ones(2), torch.zeros(2))
    assert y.__tensor_flatten__()[0] == ["vals", "mask"]
    assert x.__tensor_flatten__()[1] != y.__tensor_flatten__()[1]  # presence is part of the ctx
    # map_inner keeps an absent optional absent.
    assert (x * 2).mask is None and torch.equal((y * 2).mask, torch.zeros(2))


def test_meta_values_of_many_hashable_picklable_kinds_are_accepted():
    for v in (3, "s", None, 1.5, (1, (2, "x")), frozenset({"a", "b"}), Cfg("c"), torch.float16):
        x = Opt(torch.ones(1), label=v)
        assert x.label == v
        assert x.__tensor_flatten__()[1].label == v


# ---- bad input at construction -------------------------------------------------------------


def test_tensor_passed_as_meta_value_is_refused():
    with pytest.raises(FieldDeclarationError) as info:
        BlockScaled(_q(32), torch.rand(1, 1), block=torch.tensor(32))
    assert_expected_inline(
        str(info.value),
        """BlockScaled.block is a meta field but the value passed is a tensor (Tensor of shape ()). Tensors in the ctx break fake-tensor tracing and caching; declare it with `block: torch.Tensor = inner()` instead, or pass a Python value.""",
    )


def test_unhashable_meta_value_is_refused():
    with pytest.raises(FieldDeclarationError) as info:
        Opt(torch.ones(1), label=[1, 2])
    msg = str(info.value)
    assert "Opt.label" in msg and "not hashable" in msg and "tuple instead of a list" in msg
    assert isinstance(info.value, TypeError)


def test_unpicklable_meta_value_is_refused():
    def local_fn():
        return 0

    with pytest.raises(FieldDeclarationError) as info:
        Opt(torch.ones(1), label=local_fn)
    msg = str(info.value)
    assert "Opt.label" in msg and "cannot be pickled" in msg and "module level" in msg


def test_the_meta_value_cache_does_not_let_a_bad_value_through_a_second_time():
    # The first refusal must not be remembered as "checked" (a local function is hashable,
    # so it reaches the cache of checked values).
    def local_fn():
        return 0

    for _ in range(2):
        with pytest.raises(FieldDeclarationError, match="cannot be pickled"):
            Opt(torch.ones(1), label=local_fn)


def test_inner_tensors_on_different_devices_are_refused():
    with pytest.raises(ConstructionError) as info:
        TwoTensor(torch.ones(2), torch.ones(2, device="meta"))
    assert_expected_inline(
        str(info.value),
        """TwoTensor.b is on meta but the primary inner tensor 'a' is on cpu. All inner tensors must share one device: move it with .to('cpu').""",
    )
    assert isinstance(info.value, TypeError)


def test_non_tensor_inner_is_refused():
    with pytest.raises(ConstructionError) as info:
        TwoTensor(torch.ones(2), [1.0, 2.0])
    assert_expected_inline(
        str(info.value),
        """TwoTensor.b is an inner tensor field but got a list ([1.0, 2.0]). Pass a torch.Tensor (e.g. torch.as_tensor(...)).""",
    )


def test_inner_dtype_declared_on_the_field_is_checked():
    with pytest.raises(ConstructionError) as info:
        ScaledTensor(torch.ones(2, 2), torch.ones(2, 1))
    assert_expected_inline(
        str(info.value),
        """ScaledTensor.qdata must have dtype torch.int8 but got torch.float32; convert it with .to(torch.int8).""",
    )


def test_shapes_contradicting_inner_shapes_are_refused():
    with pytest.raises(InnerShapeError) as info:
        BlockScaled(_q(64), torch.rand(3, 1), block=32)
    assert_expected_inline(
        str(info.value),
        """BlockScaled.scale has shape (3, 1) but BlockScaled.__inner_shapes__ expects (2, 1) for outer size (64, 4) (dim 0: expected 2, got 3). Pass matching tensors, pass size= for the outer tensor, or fix __inner_shapes__.""",
    )
    assert isinstance(info.value, ValueError)


def test_rank_contradicting_inner_shapes_is_refused():
    with pytest.raises(InnerShapeError) as info:
        ScaledTensor(_q(4), torch.rand(4), dtype=torch.float32)
    msg = str(info.value)
    assert "ScaledTensor.scale" in msg and "(4,)" in msg and "(4, 1)" in msg and "ndim 1 vs 2" in msg


def test_default_inner_shapes_refuse_mismatched_twotensor_and_bad_size_override():
    with pytest.raises(InnerShapeError, match=r"TwoTensor\.b has shape \(3,\)"):
        TwoTensor(torch.ones(2), torch.ones(3))
    with pytest.raises(InnerShapeError, match=r"Flat\.buf has shape \(6,\).*expects \(8,\)"):
        Flat(torch.arange(6.0), size=(2, 4))


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: TwoTensor(torch.ones(1), torch.ones(1), torch.ones(1)), ["at most 2 positional", "a, b"]),
        (lambda: TwoTensor(torch.ones(1), torch.ones(1), c=1), ["unexpected keyword argument 'c'", "['a', 'b']"]),
        (lambda: TwoTensor(torch.ones(1), a=torch.ones(1)), ["multiple values for field 'a'"]),
        (lambda: TwoTensor(torch.ones(1)), ["missing its inner tensor 'b'"]),
        (lambda: TwoTensor(torch.ones(1), None), ["missing its inner tensor 'b'", "optional=True"]),
        (lambda: NeedsMeta(torch.ones(1)), ["missing its meta field 'k'", "k=..."]),
    ],
    ids=["too-many-positional", "unknown-kwarg", "duplicate", "missing-inner", "none-inner", "missing-meta"],
)
def test_binding_mistakes_name_the_class_and_field(call, words):
    with pytest.raises(ConstructionError) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(("TwoTensor", "NeedsMeta")), msg
    for w in words:
        assert w in msg, (w, msg)
