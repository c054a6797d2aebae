"""The public authoring surface the exemplars live on (issue 22): ``Cls.make``, ``make_ctx``,
``ctx_of``, ``ctx_reader``, ``op_aliasing``, ``fallbacks.per_op``, ``__check_handlers__``, and
the one runtime object per class behind them."""

from __future__ import annotations

import pytest
import torch

from subclass_kit import WrapperTensor, ctx_of, fallbacks, inner, meta, state
from subclass_kit.examples import BlockScaled, TwoTensor

aten = torch.ops.aten


class Pair(WrapperTensor):
    a: torch.Tensor = inner()
    b: torch.Tensor = inner(optional=True)
    tag: str = meta(default="t")
    scale: int = meta(default=1)
    _note: object = state(default=None)


class Child(Pair):
    extra: int = meta(default=0)


def test_each_class_has_its_own_runtime_object_and_make():
    assert Pair.__kit__ is not Child.__kit__ and Pair.__kit__.cls is Pair
    assert Child.__kit__.inner_names == ("a", "b")
    assert Pair.make is Pair.__kit__.make and Child.make is not Pair.make
    assert not [k for c in (Pair, Child, TwoTensor) for k in vars(c) if k.startswith("_kit_")]


def test_make_builds_what_from_parts_builds():
    x = Pair(torch.ones(2, 3), torch.zeros(2, 3), tag="x")
    ctx = ctx_of(x)
    y = Pair.make((x.a, x.b), ctx, (3, 2), (1, 3), 0, state={"_note": "n"})
    z = Pair.from_parts((x.a, x.b), ctx, size=(3, 2), stride=(1, 3), _note="n")
    for t in (y, z):
        assert type(t) is Pair and t.shape == (3, 2) and t.stride() == (1, 3)
        assert t.a is x.a and ctx_of(t) == ctx and t._note == "n" and t.tag == "x"
    with pytest.raises(TypeError, match=r"Pair has no state named \['_typo'\]"):
        Pair.make((x.a, x.b), ctx, (2, 3), (3, 1), state={"_typo": 1})
    g = Pair.make((x.a, None), ctx_of(x).replace(present=("a",)), (2, 3), (3, 1), 0, True)
    assert g.requires_grad and g.b is None


def test_make_ctx_and_ctx_reader_read_by_name():
    ctx = Child.make_ctx(dtype=torch.float16, scale=3)
    assert (ctx.tag, ctx.scale, ctx.extra, ctx.dtype, ctx.present) == ("t", 3, 0, torch.float16, ("a", "b"))
    x = Child.make((torch.ones(2), torch.ones(2)), ctx, (2,), (1,))
    assert Child.ctx_reader("extra", "tag")(x) == (0, "t")
    assert Child.ctx_reader("scale")(x) == 3
    assert Child.ctx_reader("tag", "scale", "extra")(x) == ("t", 3, 0)
    assert Pair.ctx_reader("scale")(x) == 3  # a parent's reader reads a child's fields
    with pytest.raises(AttributeError, match=r"Child has no meta field 'sclae'; its meta fields are \['tag', 'scale', 'extra'\]"):
        Child.ctx_reader("sclae")
    with pytest.raises(TypeError, match="not a meta field"):
        Child.make_ctx(dtype=torch.float32, nope=1)
    with pytest.raises(TypeError, match="ctx_of"):
        ctx_of(torch.ones(1))


def test_op_aliasing_describes_the_schema():
    add_, t, add = (Pair.op_aliasing(f) for f in (aten.add_.Tensor, aten.t.default, aten.add.Tensor))
    assert add.functional and not add.writes and not add.simple_view
    assert t.simple_view and t.views == ((0, 0),) and not t.functional
    assert add_.writes == ((0, "self"),) and not add_.functional
    assert Pair.op_aliasing(aten.add.Tensor) is add  # planned once per op


class PerOp(WrapperTensor):
    payload: torch.Tensor = inner()


_RESOLVED: list = []


def _per_op_rule(func):
    _RESOLVED.append(func)
    if func is aten.neg.default:
        return lambda func, types, args, kwargs: PerOp(-args[0].payload)
    return None


PerOp.__fallback__ = staticmethod(fallbacks.per_op(_per_op_rule))


def test_per_op_fallback_is_resolved_once_per_op_and_cached():
    x = PerOp(torch.ones(2))
    for _ in range(3):
        assert torch.equal((-x).payload, -torch.ones(2))
    assert _RESOLVED.count(aten.neg.default) == 1
    with pytest.raises(NotImplementedError, match=r"PerOp has no handler for aten\.sin\.default"):
        torch.sin(x)


def test_trust_is_declared_not_found_by_file():
    from subclass_kit import _dispatch

    from subclass_kit.examples import ScaledTensor

    assert hasattr(_dispatch.resolve(ScaledTensor, aten.mm.default), "__wrapped__")  # an example's: checked
    assert _dispatch.resolve(BlockScaled, aten.mm.default) is fallbacks.to_plain  # the kit's own: not
    from subclass_kit.sharded import ShardedTensor

    assert ShardedTensor.__check_handlers__ is False
    h = _dispatch.resolve(ShardedTensor, aten.mm.default)
    assert not hasattr(h, "__wrapped__")


class OwnMake(WrapperTensor):
    """A class with a factory named ``make`` keeps it; the kit's is ``__kit__.make``."""

    payload: torch.Tensor = inner()

    @classmethod
    def make(cls, value):
        return cls(torch.full((2,), float(value)))


class OwnMakeChild(OwnMake):
    pass


def test_a_class_keeps_its_own_make():
    assert OwnMake.make(3).payload.tolist() == [3.0, 3.0]
    assert type(OwnMakeChild.make(1)) is OwnMakeChild
    x = OwnMake.__kit__.make((torch.ones(2),), ctx_of(OwnMake.make(1)), (2,), (1,))
    assert type(x) is OwnMake and x.payload.tolist() == [1.0, 1.0]


class Viewed(WrapperTensor):
    """A wrapper whose in-place view handlers return the out-of-place view (the pattern
    docs/authoring.md describes): ``t_`` re-describes the data, ``squeeze_`` is planted wrong
    (it returns a copy)."""

    payload: torch.Tensor = inner()
    turns: int = meta(default=0)


@Viewed.implements(aten.t_.default)
def _viewed_t_(func, types, args, kwargs):
    x = args[0]
    v = x.payload.t()
    ctx = Viewed.make_ctx(dtype=v.dtype, turns=Viewed.ctx_reader("turns")(x) + 1)
    return Viewed.correct_aliasing(func, args, kwargs, Viewed.make((v,), ctx, v.shape, v.stride()))


@Viewed.implements(aten.squeeze_.dim)
def _viewed_squeeze_copy(func, types, args, kwargs):
    x = args[0]
    v = x.payload.squeeze(args[1]).clone()  # moved data: no in-place view
    return Viewed.correct_aliasing(func, args, kwargs, Viewed.make((v,), ctx_of(x), v.shape, v.stride()))


def test_an_inplace_view_handler_may_return_the_out_of_place_view():
    x = Viewed(torch.arange(6.0).view(2, 3))
    base = x.payload
    assert x.t_() is x
    assert tuple(x.shape) == (3, 2) and x.stride() == (1, 3)
    assert Viewed.ctx_reader("turns")(x) == 1
    # The inner tensor was re-described in place: same object, same storage, transposed.
    assert x.payload is base and torch.equal(x.payload, torch.arange(6.0).view(2, 3).t())


def test_an_inplace_view_handler_that_moves_data_is_refused():
    from subclass_kit.errors import HandlerResultError

    x = Viewed(torch.ones(1, 3))
    with pytest.raises(HandlerResultError, match=r"Viewed: the handler of aten\.squeeze_\.dim .*'payload' is not a view"):
        x.squeeze_(0)
