"""Authors' mistakes caught where they are made, each with a named error (issue 13).

Every test here failed before the fix: the mistake was accepted silently or surfaced later
as a raw torch error naming neither the class nor the field.
"""

from __future__ import annotations

import copy
import io
import pickle
from typing import Literal, Optional

import pytest
import torch
from expecttest import assert_expected_inline

from subclass_kit import (
    ConstructionError,
    FieldDeclarationError,
    FrozenFieldError,
    HandlerResultError,
    InnerShapeError,
    InnerShapesKeyError,
    MetaTypeError,
    OuterArgumentError,
    SubclassKitError,
    UnsupportedOpError,
    WrapperTensor,
    fallbacks,
    inner,
    meta,
)
from subclass_kit.examples import BlockScaled, TwoTensor
from symbolic import ceil_div


def _q(rows=64, cols=8):
    return torch.randint(-5, 5, (rows, cols), dtype=torch.int8)


class WrongKey(WrapperTensor):
    """BlockScaled with a typo in ``__inner_shapes__`` ('scales')."""

    qdata: torch.Tensor = inner()
    scale: torch.Tensor = inner()
    block: int = meta(default=32)

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        rows, cols = outer_size
        return {"qdata": (rows, cols), "scales": (ceil_div(rows, ctx.block), 1)}


class OmitsKey(WrongKey):
    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"qdata": tuple(outer_size)}


class ReturnsList(WrongKey):
    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return [tuple(outer_size), (2, 1)]


class OptInner(WrapperTensor):
    vals: torch.Tensor = inner()
    mask: torch.Tensor = inner(optional=True)

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"vals": tuple(outer_size)}  # mask left out: fine while it is absent


class Typed(WrapperTensor):
    vals: torch.Tensor = inner()
    k: int = meta(default=1)
    eps: float = meta(default=0.5)
    axis: Literal["row", "col"] = meta(default="row")
    maybe: Optional[str] = meta(default=None)
    pair: tuple[int, int] = meta(default=(1, 2))
    anything: object = meta(default="x")
    __fallback__ = fallbacks.map_inner


# ---- 1. __inner_shapes__ returning a wrong key or omitting one ------------------------------


def test_inner_shapes_with_a_wrong_key_is_refused_at_construction():
    with pytest.raises(InnerShapesKeyError) as info:
        WrongKey(_q(), torch.ones(2, 1))
    assert isinstance(info.value, InnerShapeError) and isinstance(info.value, ValueError)
    assert_expected_inline(
        str(info.value),
        """WrongKey.__inner_shapes__(outer_size=(64, 8), ctx) returned keys 'qdata', 'scales', but 'scales' is not an inner field of WrongKey (its inner fields: 'qdata', 'scale'). Fix the keys of the dict WrongKey.__inner_shapes__ returns; leave out an inner field whose shape is free.""",
    )


def test_inner_shapes_leaving_out_an_inner_means_its_shape_is_free():
    # API.md: an inner field __inner_shapes__ leaves out has a free shape; only unknown keys
    # and a non-dict are mistakes.
    for scale in (torch.ones(2, 1), torch.ones(5), torch.ones(3, 7, 2)):
        x = OmitsKey(_q(), scale)
        assert x.scale is scale and tuple(x.shape) == (64, 8)
    with pytest.raises(InnerShapeError, match=r"OmitsKey.qdata has shape \(3, 8\)"):
        OmitsKey(_q(3), torch.ones(2), size=(64, 8))
    with pytest.raises(InnerShapesKeyError, match=r"returned a list, not a dict"):
        ReturnsList(_q(), torch.ones(2, 1))


def test_inner_shapes_may_leave_out_an_optional_inner_present_or_not():
    assert OptInner(torch.ones(3)).mask is None
    assert tuple(OptInner(torch.ones(3), torch.ones(5)).mask.shape) == (5,)


# ---- 2, 3. assigning a declared field after construction ------------------------------------


def test_assigning_an_inner_field_after_construction_is_refused():
    x = BlockScaled.from_float(torch.randn(64, 8))
    scale = x.scale
    with pytest.raises(FrozenFieldError) as info:
        x.scale = torch.ones(2, 1)
    assert isinstance(info.value, AttributeError) and isinstance(info.value, SubclassKitError)
    assert_expected_inline(
        str(info.value),
        """BlockScaled.scale is a declared inner tensor field and is read-only after construction (it was assigned a value of type Tensor). Compiled code guards and rebuilds a wrapper from its fields, so changing one in place would go unnoticed. Build a new instance instead: BlockScaled(qdata=x.qdata, scale=<new value>, block=x.block, dtype=x.dtype).""",
    )
    with pytest.raises(FrozenFieldError, match=r"BlockScaled\.qdata .* assigned a value of type float"):
        x.qdata = 3.0
    with pytest.raises(FrozenFieldError, match=r"BlockScaled\.scale .* deleted"):
        del x.scale
    assert x.scale is scale and x.qdata.dtype == torch.int8


def test_assigning_a_meta_field_is_refused_with_the_same_error():
    x = BlockScaled.from_float(torch.randn(64, 8))
    with pytest.raises(FrozenFieldError, match=r"BlockScaled\.block is a declared meta field .* block=<new value>"):
        x.block = 16
    assert x.block == 32


def test_assigning_a_field_inside_a_compiled_function_is_refused():
    x = BlockScaled.from_float(torch.randn(64, 8))

    def f(t):
        t.scale = t.scale * 2
        return t.to_plain()

    with pytest.raises(FrozenFieldError, match=r"BlockScaled\.scale"):
        torch.compile(f, backend="eager")(x)


def test_other_attributes_stay_settable_and_the_kits_own_writers_still_work():
    x = BlockScaled.from_float(torch.randn(64, 8))
    x.note = "mine"
    x.requires_grad = True
    assert x.note == "mine" and x.requires_grad
    # pickling, deepcopy, dispatch outputs and unflatten fill __dict__ directly
    y = pickle.loads(pickle.dumps(x.detach()))
    z = copy.deepcopy(x)
    t = TwoTensor(torch.ones(2, 3), torch.zeros(2, 3))
    u = (t + 1).t()
    names, ctx = t.__tensor_flatten__()
    v = TwoTensor.__tensor_unflatten__({"a": t.a, "b": t.b}, ctx, t.shape, t.stride())
    buf = io.BytesIO()
    torch.save(x.detach(), buf)
    assert torch.equal(y.to_plain(), x.detach().to_plain()) and torch.equal(z.scale, x.scale)
    assert u.a.shape == (3, 2) and v.b is t.b
    p = torch.nn.Parameter(BlockScaled.from_float(torch.randn(64, 8)))
    assert isinstance(p, BlockScaled) and p._is_param


# ---- 4. a bogus stride= ---------------------------------------------------------------------


class Flat(WrapperTensor):
    buf: torch.Tensor = inner()

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        n = 1
        for s in outer_size:
            n = n * s
        return {"buf": (n,)}


def test_stride_of_the_wrong_length_is_refused():
    with pytest.raises(OuterArgumentError) as info:
        BlockScaled(_q(), torch.ones(2, 1), stride=(1, 2, 3))
    assert isinstance(info.value, ConstructionError) and isinstance(info.value, ValueError)
    assert_expected_inline(
        str(info.value),
        """BlockScaled: stride= (1, 2, 3) has 3 entries but the outer size (64, 8) has 2 dimensions. Pass one stride per dimension, e.g. stride=(8, 1) (row-major), or leave stride= out.""",
    )


def test_overlapping_or_negative_stride_is_refused():
    with pytest.raises(OuterArgumentError, match=r"stride= \(1, 1\) overlaps for the outer size \(2, 3\)"):
        Flat(torch.arange(6.0), size=(2, 3), stride=(1, 1))
    with pytest.raises(OuterArgumentError, match=r"overlaps"):
        Flat(torch.arange(6.0), size=(2, 3), stride=(0, 1))
    with pytest.raises(OuterArgumentError, match=r"negative stride"):
        Flat(torch.arange(6.0), size=(2, 3), stride=(3, -1))
    with pytest.raises(OuterArgumentError, match=r"sequence of ints"):
        Flat(torch.arange(6.0), size=(2, 3), stride="3,1")


def test_stride_contradicting_a_primary_of_the_outer_shape_is_refused():
    with pytest.raises(OuterArgumentError) as info:
        BlockScaled(_q(), torch.ones(2, 1), stride=(100, 1))
    assert_expected_inline(
        str(info.value),
        """BlockScaled: stride= (100, 1) differs from the strides (8, 1) of the primary inner tensor, which has the outer size (64, 8) and so backs the outer layout. Leave stride= out (the primary's layout is used), or lay the primary out that way first: torch.empty_strided(size, stride, dtype=...).copy_(primary).""",
    )


def test_valid_strides_are_still_accepted():
    assert Flat(torch.arange(6.0), size=(2, 3), stride=(1, 2)).stride() == (1, 2)  # column-major
    sliced = torch.randn(2, 6)[:, ::2]  # gaps between elements
    assert TwoTensor(sliced, sliced.clone(), stride=(6, 2)).stride() == (6, 2)
    assert Flat(torch.arange(3.0), size=(1, 3), stride=(0, 1)).stride() == (0, 1)  # size-1 dim: free
    a = torch.randn(3, 5).t()
    assert TwoTensor(a, a.clone(), stride=a.stride()).stride() == a.stride()


# ---- 5. a meta value of the wrong type for its annotation -----------------------------------


def test_meta_value_of_the_wrong_type_is_refused_at_construction():
    with pytest.raises(MetaTypeError) as info:
        BlockScaled(_q(), torch.ones(2, 1), block="32")
    assert isinstance(info.value, ConstructionError) and isinstance(info.value, TypeError)
    assert_expected_inline(
        str(info.value),
        """BlockScaled.block is a meta field annotated int but the value passed is '32' (a str). Pass block=32, or change the annotation if the field is meant to hold a str.""",
    )
    # the per-class cache of accepted values does not let it through a second time
    with pytest.raises(MetaTypeError):
        BlockScaled(_q(), torch.ones(2, 1), block="32")


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"k": 1.5}, "Typed.k is a meta field annotated int but the value passed is 1.5"),
        ({"eps": "0.1"}, "Pass eps=0.1"),
        ({"axis": "diag"}, "annotated one of ('row', 'col')"),
        ({"maybe": 3}, "annotated str | None"),
        # the type comes first: a list for a tuple field is the wrong type (issue 23)
        ({"pair": [1, 2]}, "annotated tuple but the value passed is [1, 2] (a list)"),
        ({"pair": 3}, "annotated tuple"),
        ({"k": [1, 2]}, "annotated int but the value passed is [1, 2] (a list)"),
        ({"k": True}, "annotated int but the value passed is True (a bool)"),
        ({"anything": [1, 2]}, "is not hashable"),  # no type to blame: hashability is the rule
    ],
    ids=["int", "float-from-str", "literal", "optional", "list-for-tuple", "generic", "list-for-int",
         "bool-for-int", "unhashable"],
)
def test_meta_annotations_that_are_checked(kwargs, words):
    with pytest.raises((MetaTypeError, FieldDeclarationError)) as info:
        Typed(torch.ones(2), **kwargs)
    assert words in str(info.value)


def test_meta_values_the_annotation_allows_are_accepted():
    import numpy as np

    x = Typed(torch.ones(2), k=np.int64(3), eps=2, axis="col", maybe="m", pair=(3, 4), anything=b"raw")
    assert (x.k, x.eps, x.axis, x.maybe, x.pair) == (3, 2, "col", "m", (3, 4))


def test_meta_default_of_the_wrong_type_is_refused_at_class_definition():
    with pytest.raises(FieldDeclarationError, match=r"Bad\.block is a meta field annotated int but its default is '32'"):

        class Bad(WrapperTensor, abstract=True):
            block: int = meta(default="32")


# ---- 7. a string dtype (and other outer arguments) ------------------------------------------


def test_string_dtype_is_refused_with_the_spelling_to_use():
    with pytest.raises(OuterArgumentError) as info:
        BlockScaled(_q(), torch.ones(2, 1), dtype="float32")
    assert_expected_inline(
        str(info.value),
        """BlockScaled: dtype= must be a torch.dtype (e.g. torch.float32) but got 'float32' (a str). Pass dtype=torch.float32.""",
    )
    with pytest.raises(OuterArgumentError, match=r"device= must be a torch.device"):
        BlockScaled(_q(), torch.ones(2, 1), device="gpu0")
    with pytest.raises(OuterArgumentError, match=r"size= must be a sequence of ints"):
        Flat(torch.arange(6.0), size=6)


# ---- 6. a handler returning a list or a float where a tensor is due -------------------------

aten = torch.ops.aten


class Careless(WrapperTensor):
    payload: torch.Tensor = inner()
    __fallback__ = fallbacks.map_inner


@Careless.implements(aten.add.Tensor)
def _add_returns_list(func, types, args, kwargs):
    return [args[0].payload + args[1]]


@Careless.implements(aten.mul.Tensor)
def _mul_returns_float(func, types, args, kwargs):
    return 3.0


@Careless.implements(aten.max.dim)
def _max_returns_one(func, types, args, kwargs):
    return args[0].payload.max(args[1]).values


@Careless.implements(aten.sub.Tensor)
def _sub_is_fine(func, types, args, kwargs):
    return Careless(args[0].payload - args[1])


def test_handler_returning_a_list_names_op_class_handler_and_value():
    with pytest.raises(HandlerResultError) as info:
        Careless(torch.ones(2)) + 1
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, SubclassKitError)
    # the handler is named by module and qualname; the module's name depends on the import mode
    assert f"({_add_returns_list.__module__}._add_returns_list)" in str(info.value)
    assert_expected_inline(
        str(info.value).replace(_add_returns_list.__module__, "<module>"),
        """Careless's handler for aten.add.Tensor (<module>._add_returns_list) returned a list ([tensor([2., 2.])]), but aten.add.Tensor returns one Tensor. Return one tensor: a plain torch.Tensor or a Careless (build one with Careless(...)); if the list holds the result, return its element.""",
    )


def test_handler_returning_a_float_or_too_few_results_is_named():
    with pytest.raises(HandlerResultError, match=r"aten\.mul\.Tensor .*_mul_returns_float\) returned a float \(3\.0\)"):
        Careless(torch.ones(2)) * 2
    with pytest.raises(HandlerResultError, match=r"returns a tuple \(Tensor, Tensor\)"):
        torch.max(Careless(torch.ones(2, 3)), 1)


def test_correct_handlers_and_the_kits_own_are_unchanged():
    y = Careless(torch.ones(2)) - 1
    assert type(y) is Careless and y.payload.tolist() == [0.0, 0.0]
    # the kit's own handlers are not wrapped: nothing added to their per-op path
    from subclass_kit import _dispatch as dispatch
    from subclass_kit.examples import ScaledTensor

    assert dispatch.resolve(Careless, aten.neg.default) is fallbacks.map_inner
    assert dispatch.resolve(Careless, aten.sub.Tensor).__wrapped__ is _sub_is_fine
    # trust is by registration, not by the file a handler is defined in: the examples'
    # handlers are checked like any author's, a class that vouches for its own is not
    assert dispatch.resolve(ScaledTensor, aten.mm.default).__wrapped__ is dispatch.find_registered(ScaledTensor, aten.mm.default)
    assert dispatch.resolve(Vouched, aten.neg.default) is _vouched_neg


class Vouched(WrapperTensor):
    payload: torch.Tensor = inner()
    __check_handlers__ = False


@Vouched.implements(aten.neg.default)
def _vouched_neg(func, types, args, kwargs):
    return Vouched(-args[0].payload)


# ---- 8. to_plain() on a wrapper that requires grad is differentiable ------------------------


def _dense_reference(x, loss_fn):
    d = x.detach().to_plain().clone().requires_grad_(True)
    loss_fn(d).backward()
    return d.grad


def _loss(p):
    w = torch.linspace(-1.0, 1.0, p.shape[-1], dtype=p.dtype)
    return ((p * w).sin() ** 2).sum() + p.pow(3).mean()


@pytest.mark.parametrize("backend", [None, "aot_eager"], ids=["eager", "aot_eager"])
def test_to_plain_is_differentiable_and_matches_the_dense_gradient(backend):
    q = BlockScaled.from_float(torch.randn(70, 8, generator=torch.Generator().manual_seed(0)), block=16)
    x = BlockScaled(q.qdata, q.scale, block=16, dtype=torch.float32, requires_grad=True)
    t = TwoTensor(torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)).requires_grad_()
    for w in (x, t):
        f = (lambda v: _loss(v.to_plain())) if backend is None else torch.compile(
            lambda v: _loss(v.to_plain()), backend=backend, fullgraph=True
        )
        loss = f(w)
        assert loss.grad_fn is not None
        loss.backward()
        ref = _dense_reference(w, _loss)
        assert type(w.grad) is torch.Tensor  # the wrapper's value is its dense tensor
        torch.testing.assert_close(w.grad, ref)


def test_to_plain_without_grad_is_unchanged_and_handlers_record_nothing():
    t = TwoTensor(torch.ones(2, 2), torch.zeros(2, 2))
    assert t.to_plain() is t.a  # no grad: the inner tensor itself, as before
    g = TwoTensor(torch.ones(2, 2), torch.zeros(2, 2)).requires_grad_()
    with torch.no_grad():
        assert g.to_plain().grad_fn is None
    p = g.to_plain()
    assert p.data_ptr() == g.a.data_ptr() and g.a.grad_fn is None  # a view; the inner is untouched
    # ScaledTensor's mm handler calls a.to_plain() below autograd: the grad is torch's mm grad
    from subclass_kit.examples import ScaledTensor

    w = ScaledTensor.from_float(torch.randn(4, 3))
    wq = ScaledTensor(w.qdata, w.scale, dtype=torch.float32, requires_grad=True)
    a = torch.randn(2, 4, requires_grad=True)
    torch.mm(a, wq).sum().backward()
    torch.testing.assert_close(wq.grad, a.detach().t() @ torch.ones(2, 3))


class WrongShapePlain(WrapperTensor):
    vals: torch.Tensor = inner()

    def to_plain(self):
        return self.vals.reshape(-1)


def test_to_plain_of_another_shape_under_grad_is_refused_with_the_fix():
    x = WrongShapePlain(torch.ones(2, 3), requires_grad=True)
    with pytest.raises(UnsupportedOpError, match=r"WrongShapePlain\.to_plain\(\) returned shape \(6,\) .* x\.detach\(\)"):
        x.to_plain()
    assert x.detach().to_plain().shape == (6,)
