"""The base class's extension surface: state(), __post_init__, from_parts, __op_handler__,
rewrap and correct_aliasing, on throwaway subclasses defined here."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from subclass_kit import FieldDeclarationError, WrapperTensor, fallbacks, inner, meta, state

aten = torch.ops.aten


class Counted(WrapperTensor):
    payload: torch.Tensor = inner()
    scale: float = meta(default=1.0)
    _reads: int = state(default=0)
    _log: object = state()

    __fallback__ = fallbacks.map_inner

    def __post_init__(self):
        self._log = ["built"]


def test_state_is_not_a_field_and_not_in_the_ctx():
    c = Counted(torch.ones(2, 3), scale=2.0)
    names, ctx = c.__tensor_flatten__()
    assert names == ["payload"] and ctx.fields == (("scale", 2.0),)
    assert c._reads == 0 and c._log == ["built"]
    with pytest.raises(TypeError):
        Counted(torch.ones(2), _reads=3)  # not a constructor argument
    assert [f.name for f in Counted.__kit_spec__.state] == ["_reads", "_log"]


def test_state_is_shared_by_views_and_reset_elsewhere():
    c = Counted(torch.ones(2, 3))
    c._reads = 5
    for view in (c.t(), c.detach(), c.view(6), c[0], c.unbind(0)[1]):
        assert view._reads == 5 and view._log is c._log
    for other in (c + 1, c.clone(), copy.deepcopy(c), pickle.loads(pickle.dumps(c))):
        assert type(other) is Counted and other._reads == 0 and other._log is None


def test_post_init_runs_only_on_validated_construction():
    c = Counted(torch.ones(2))
    assert c._log == ["built"]
    names, ctx = c.__tensor_flatten__()
    assert Counted.__tensor_unflatten__({"payload": c.payload}, ctx, None, None)._log is None
    assert Counted.from_parts((c.payload,))._log is None


def test_from_parts_trusts_its_parts_and_checks_state_names():
    q = torch.arange(6.0).reshape(2, 3)
    t = Counted.from_parts({"payload": q}, size=(3, 2), _reads=2)
    assert tuple(t.shape) == (3, 2) and t.stride() == (2, 1) and t._reads == 2 and t.scale == 1.0
    assert t.payload is q
    u = Counted.from_parts((q,), t.__tensor_flatten__()[1])
    assert u.__tensor_flatten__()[1] == t.__tensor_flatten__()[1]
    with pytest.raises(TypeError, match="Counted has no state named \\['_typo'\\]"):
        Counted.from_parts((q,), _typo=1)


def test_state_declaration_mistakes_are_named():
    with pytest.raises(FieldDeclarationError, match="shadows torch.Tensor.grad"):
        class Bad(WrapperTensor):  # noqa: F841
            payload: torch.Tensor = inner()
            grad: object = state()
    with pytest.raises(TypeError, match="never constructor arguments"):
        state(init=True)


class Plainly(WrapperTensor):
    """Views rewrap the payload's view; everything else computes on the payload."""

    payload: torch.Tensor = inner()

    @classmethod
    def __op_handler__(cls, func):
        if func.is_view:
            def view(func, types, args, kwargs):
                out = func(args[0].payload, *args[1:], **kwargs)
                return args[0].rewrap(func, args, kwargs, out)
            return view

        def compute(func, types, args, kwargs):
            plain = [a.payload if type(a) is Plainly else a for a in args]
            return WrapperTensor.correct_aliasing(func, args, kwargs, func(*plain, **kwargs))
        return compute


def test_op_handler_classifies_ops_and_rewrap_aliases():
    x = Plainly(torch.arange(6.0).reshape(2, 3))
    assert type(x + 1) is torch.Tensor
    v = torch.ops.aten.expand.default(x, [2, 2, 3], implicit=True)  # keyword argument: still a view
    assert type(v) is Plainly and v.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert x.add_(1) is x and x.payload[0, 0].item() == 1.0  # in-place returns the written wrapper
    assert type(x.t()) is Plainly and x.t()._base is x


def test_parts_builder_builds_what_from_parts_builds():
    q = torch.arange(6.0).reshape(2, 3)
    ctx = Counted(q, scale=2.0).__tensor_flatten__()[1]
    make = Counted.parts_builder(ctx, size=(3, 2), stride=(2, 1), _reads=4)
    t, u = make(q), Counted.from_parts((q,), ctx, size=(3, 2), stride=(2, 1), offset=0, _reads=4)
    for x in (t, u):
        assert type(x) is Counted and x.payload is q and x.scale == 2.0 and x._reads == 4 and x._log is None
    assert (tuple(t.shape), t.stride(), t.storage_offset()) == (tuple(u.shape), u.stride(), u.storage_offset())
    assert t.__tensor_flatten__()[1] == u.__tensor_flatten__()[1]
    shifted = Counted.parts_builder(ctx, size=(2,), stride=(1,), offset=1)(q)  # the general path
    assert tuple(shifted.shape) == (2,) and shifted.storage_offset() == 1
    with pytest.raises(TypeError, match="Counted has no state named \\['_typo'\\]"):
        Counted.parts_builder(ctx, size=(3, 2), stride=(2, 1), _typo=1)
