"""Op tables: ``implements`` / ``implements_torch_function`` with inheritance, the fallbacks, and
``UnsupportedOpError``. Each test registers on its own module-level classes so tables do not
leak between tests."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from expecttest import assert_expected_inline
from torch._dynamo.utils import counters

from kit_helpers.compiling import compile_counted, graph_breaks

from subclass_kit import UnsupportedOpError, WrapperTensor, fallbacks, inner, meta
from subclass_kit.examples import BlockScaled, ScaledTensor

aten = torch.ops.aten


def _handler(tag):
    """A handler that returns a recognisable plain tensor."""

    def fn(func, types, args, kwargs):
        return torch.full((1,), float(tag))

    fn.tag = tag
    return fn


class P1(WrapperTensor):
    val: torch.Tensor = inner()


class C1(P1):
    pass


class G1(C1):
    extra: int = meta(default=0)


class Strict(WrapperTensor):
    """No handlers, default fallback: every op but the built-ins raises."""

    val: torch.Tensor = inner()
    other: torch.Tensor = inner()


class Planned(WrapperTensor):
    """Not outer-shaped (scale is (rows, 1)) and no fallback: views are unsupported."""

    val: torch.Tensor = inner()
    scale: torch.Tensor = inner()

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"val": tuple(outer_size), "scale": (outer_size[0], 1)}


class Dense(WrapperTensor):
    """to_plain fallback."""

    val: torch.Tensor = inner()
    k: float = meta(default=2.0)
    __fallback__ = fallbacks.to_plain

    def to_plain(self):
        return self.val * self.k


class NoPlain(WrapperTensor):
    val: torch.Tensor = inner()
    __fallback__ = fallbacks.to_plain


class Mapped(WrapperTensor):
    one: torch.Tensor = inner()
    two: torch.Tensor = inner()
    __fallback__ = fallbacks.map_inner


def _mk(cls, *shape):
    names = cls.__kit_spec__.inner_names
    return cls(*[torch.ones(*shape) for _ in names])


# ---- implements ------------------------------------------------------------------------------


def test_child_table_extends_parent_and_registration_after_creation_is_seen():
    p, c, g = _mk(P1, 2), _mk(C1, 2), _mk(G1, 2)
    with pytest.raises(UnsupportedOpError):
        torch.neg(c)  # also fills C1's resolution cache with the fallback
    P1.implements(aten.neg.default)(_handler(1))
    # Registered on the parent after the children exist and after C1 resolved neg.
    assert [torch.neg(t).item() for t in (p, c, g)] == [1.0, 1.0, 1.0]
    # A child's own registration wins for itself and its descendants, not for the parent.
    C1.implements(aten.neg.default)(_handler(2))
    assert [torch.neg(t).item() for t in (p, c, g)] == [1.0, 2.0, 2.0]
    # The child table extends the parent's: other parent ops still reach the child.
    P1.implements(aten.abs.default)(_handler(3))
    assert torch.abs(g).item() == 3.0
    # And a grandchild-only registration is invisible upward.
    G1.implements(aten.exp.default)(_handler(4))
    assert torch.exp(g).item() == 4.0
    with pytest.raises(UnsupportedOpError):
        torch.exp(c)


class P2(WrapperTensor):
    val: torch.Tensor = inner()


class C2(P2):
    pass


def test_overload_beats_packet_at_every_level_and_packet_covers_all_overloads():
    P2.implements(aten.add)(_handler(1))  # packet: add.Tensor, add.Scalar, ...
    x, y = _mk(P2, 2), _mk(C2, 2)
    assert torch.add(x, 1).item() == 1.0 and torch.add(x, x).item() == 1.0
    P2.implements(aten.add.Tensor)(_handler(2))
    assert torch.add(x, x).item() == 2.0
    # The child's packet registration outranks the parent's overload (nearest class first).
    C2.implements(aten.add)(_handler(3))
    assert torch.add(y, y).item() == 3.0 and torch.add(x, x).item() == 2.0


def test_one_handler_for_several_ops_and_bad_registrations():
    class_ops = (aten.sin.default, aten.cos.default)
    deco = P2.implements(*class_ops)
    fn = deco(_handler(7))
    assert fn.tag == 7  # the decorator returns the function unchanged
    x = _mk(P2, 1)
    assert torch.sin(x).item() == 7.0 and torch.cos(x).item() == 7.0
    with pytest.raises(TypeError, match="implements_torch_function"):
        P2.implements(F.relu)
    with pytest.raises(TypeError, match="at least one op"):
        P2.implements()
    with pytest.raises(TypeError, match=r"use P2\.implements"):
        P2.implements_torch_function(aten.relu.default)


def test_handler_receives_func_types_args_kwargs():
    seen = {}

    def spy(func, types, args, kwargs):
        seen.update(func=func, types=types, args=args, kwargs=kwargs)
        return torch.zeros(1)

    P2.implements(aten.sum.dim_IntList)(spy)
    x = _mk(P2, 2, 3)
    torch.sum(x, dim=1, keepdim=True)
    assert seen["func"] is aten.sum.dim_IntList
    assert P2 in seen["types"] and seen["args"][0] is x
    assert seen["args"][1:] == ([1], True) and seen["kwargs"] == {}


# ---- implements_torch_function ---------------------------------------------------------------


class TP(WrapperTensor):
    val: torch.Tensor = inner()
    __fallback__ = fallbacks.map_inner


class TC(TP):
    pass


def test_torch_function_table_with_inheritance_and_late_registration():
    p, c = TP(torch.tensor([-1.0, 2.0])), TC(torch.tensor([-3.0, 4.0]))
    # No torch-level handlers yet: torch functions decompose to aten ops (map_inner).
    assert torch.equal(F.relu(c).val, torch.tensor([0.0, 4.0]))
    calls = []

    @TP.implements_torch_function(F.relu)
    def _relu(func, types, args, kwargs):
        calls.append(type(args[0]).__name__)
        return type(args[0])(args[0].val.abs())

    # Registered after TC was created; TC inherits it.
    assert torch.equal(F.relu(p).val, torch.tensor([1.0, 2.0]))
    assert torch.equal(F.relu(c).val, torch.tensor([3.0, 4.0]))
    assert calls == ["TP", "TC"]

    @TC.implements_torch_function(F.gelu)
    def _gelu(func, types, args, kwargs):
        return torch.full((1,), 9.0)

    assert F.gelu(c).item() == 9.0
    # The child's addition does not reach the parent: gelu on TP decomposes normally.
    assert type(F.gelu(p)) is TP
    # Functions without a handler still work through the normal path (and keep the type).
    assert type(torch.add(c, 1)) is TC and torch.equal(torch.add(c, 1).val, torch.tensor([-2.0, 5.0]))


# ---- fallbacks and UnsupportedOpError --------------------------------------------------------


def test_unsupported_op_error_message():
    x = Strict(torch.ones(2, 2), torch.ones(2, 2))
    with pytest.raises(UnsupportedOpError) as info:
        torch.sin(x)
    assert isinstance(info.value, NotImplementedError)
    assert_expected_inline(
        str(info.value),
        """Strict has no handler for aten.sin.default (args: Strict). Register one with @Strict.implements(aten.sin.default), or set __fallback__ = fallbacks.to_plain (compute on the dense tensor) or fallbacks.map_inner (run the op on every inner tensor) in the class body.""",
    )
    with pytest.raises(UnsupportedOpError) as info:
        torch.add(x, torch.ones(2), alpha=2)
    msg = str(info.value)
    # API.md section 6: class name, overload, and the word implements.
    assert "Strict" in msg and "aten.add.Tensor" in msg and "implements" in msg
    assert "(args: Strict, Tensor, alpha=int)" in msg


def test_view_without_outer_shaped_inners_goes_to_the_fallback():
    x = Planned(torch.ones(4, 2), torch.ones(4, 1))
    with pytest.raises(UnsupportedOpError, match=r"Planned has no handler for aten\.t\.default"):
        x.t()
    # Outer-shaped classes get views without registration, even with the raising fallback.
    s = Strict(torch.ones(2, 3), torch.zeros(2, 3))
    v = s.t()
    assert type(v) is Strict and v.shape == (3, 2) and v.other.shape == (3, 2)


def test_to_plain_fallback_computes_densely_and_refuses_in_place():
    x = Dense(torch.tensor([1.0, -2.0]), k=3.0)
    out = torch.neg(x)
    assert type(out) is torch.Tensor and torch.equal(out, torch.tensor([-3.0, 6.0]))
    assert torch.equal(torch.mul(x, torch.tensor([2.0, 1.0])), torch.tensor([6.0, -6.0]))
    with pytest.raises(UnsupportedOpError, match=r"in-place op aten\.add_\.Tensor.*Dense\.implements"):
        x.add_(1)
    with pytest.raises(UnsupportedOpError, match=r"NoPlain uses fallbacks\.to_plain.*no to_plain"):
        torch.neg(NoPlain(torch.ones(1)))


def test_map_inner_runs_on_every_inner_and_keeps_type_and_meta():
    x = Mapped(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]))
    y = x * 2 + x
    assert type(y) is Mapped and torch.equal(y.one, torch.tensor([3.0, 6.0])) and torch.equal(y.two, torch.tensor([9.0, 12.0]))
    # Outputs that are tuples of tensors wrap elementwise.
    mx = torch.max(Mapped(torch.tensor([[1.0, 5.0]]), torch.tensor([[7.0, 2.0]])), dim=1)
    assert type(mx.values) is Mapped and mx.values.one.item() == 5.0 and mx.values.two.item() == 7.0
    # The outer dtype follows the result (eq gives bool) when it tracked the primary's.
    eq = x == x
    assert type(eq) is Mapped and eq.dtype == torch.bool and eq.__tensor_flatten__()[1].dtype == torch.bool
    # A non-tensor result comes back as the primary's.
    assert x.one.sum().item() == 3.0


@pytest.mark.parametrize("method", ["to_sparse", "to_sparse_csr", "to_mkldnn"])
def test_map_inner_refuses_a_conversion_its_strided_wrapper_cannot_hold(method):
    # Was: to_sparse wrapped two sparse_coo inners in a strided Mapped, to_sparse_csr raised
    # torch's "Sparse CSR tensors do not have strides" naming neither the class nor the op.
    from subclass_kit.examples import TwoTensor

    for x in (Mapped(torch.ones(2, 2), torch.zeros(2, 2)), TwoTensor(torch.eye(2), torch.eye(2))):
        name = type(x).__name__
        with pytest.raises(UnsupportedOpError) as e:
            getattr(x, method)()
        msg = str(e.value)
        assert msg.startswith(f"{name} cannot run aten.") and "through fallbacks.map_inner" in msg, msg
        assert f"x.to_plain().{method}()" in msg and f"@{name}.implements(" in msg, msg
    # Ops that keep the layout are unaffected.
    assert type(Mapped(torch.ones(2), torch.ones(2)).clone()) is Mapped


def test_exemplar_scaled_mm_handler_matches_dense():
    w = ScaledTensor.__samples__()[0]
    a = torch.randn(3, 16)
    torch.testing.assert_close(torch.mm(a, w), a @ w.to_plain())
    b = torch.randn(8, 2)
    torch.testing.assert_close(torch.mm(w, b), w.to_plain() @ b)
    # Everything else goes dense through the to_plain fallback.
    h = w * 0.5
    assert type(h) is torch.Tensor
    torch.testing.assert_close(h, w.to_plain() * 0.5)
    # BlockScaled has only the to_plain fallback.
    bs = BlockScaled.__samples__()[-1]
    assert bs.shape == (70, 8)
    torch.testing.assert_close(torch.mm(torch.ones(2, 70), bs), torch.ones(2, 70) @ bs.to_plain())


class TFW(WrapperTensor):
    q: torch.Tensor = inner()
    __fallback__ = fallbacks.map_inner


@TFW.implements_torch_function(F.linear)
def _tfw_linear(func, types, args, kwargs):
    x, w = args[0], args[1]
    return torch.mm(x, w.q.t()) * 10  # deliberately not linear's value: proves the handler ran


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_function_handler_is_traced_by_compile(backend):
    x, w = torch.randn(3, 4), TFW(torch.randn(5, 4))
    counters.clear()
    compiled, cnt = compile_counted(lambda x, w: F.linear(x, w).relu(), backend)
    torch.testing.assert_close(compiled(x, w), (x @ w.q.t() * 10).relu())
    assert cnt.frame_count == 1 and graph_breaks() == 0
