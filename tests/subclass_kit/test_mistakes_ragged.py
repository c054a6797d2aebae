"""Mistakes a newcomer makes with ragged and packed data, each named early (issue 28, item 5).

Every test here failed before the fix: the mistake recompiled silently, computed a wrong
value silently, or surfaced as a raw torch / Python error naming neither the class nor the
fix. (The dropped autograd graph is in test_wrap.py.)
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit import (
    ConstructionError,
    MetaRecompileWarning,
    OuterArgumentError,
    PlainMaskWarning,
    SizeSpecializedWarning,
    SymbolicSizeError,
    UnsupportedOpError,
    WrapperTensor,
    fallbacks,
    inner,
    meta,
)

aten = torch.ops.aten


# ---- (a) offsets as a meta tuple: a new graph per batch ----------------------------------------


class TupleOffsets(WrapperTensor):
    packed: torch.Tensor = inner()
    offsets: tuple = meta()


def test_a_meta_value_that_varies_per_batch_is_named():
    limit = torch._dynamo.config.recompile_limit
    # The premise, against torch: each new tuple is a new graph.
    cnt = CompileCounterWithBackend("eager")
    f = torch.compile(lambda x: x.packed * 2, backend=cnt, fullgraph=True)
    for n in range(3):
        f(TupleOffsets(torch.ones(4, 2), offsets=(0, n, 4)))
    assert cnt.frame_count == 3

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for n in range(limit + 2):
            TupleOffsets(torch.ones(4, 2), offsets=(0, 100 + n, 200 + n))
    named = [w for w in got if issubclass(w.category, MetaRecompileWarning)]
    assert len(named) == 1, [str(w.message) for w in got]
    msg = str(named[0].message)
    assert "TupleOffsets.offsets" in msg and "inner()" in msg and str(limit) in msg


def test_a_meta_value_with_few_values_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(20):
            for n in (1, 2):
                TupleOffsets(torch.ones(4, 2), offsets=(0, n))


# ---- (b) a forgotten F.linear handler; fallbacks.to_plain over padding -------------------------


class Padded(WrapperTensor):
    """Rows of a (B, L, D) batch, zero-padded past each row's length."""

    rows: torch.Tensor = inner()
    lengths: torch.Tensor = inner(dtype=torch.int64)

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"rows": tuple(outer_size), "lengths": (outer_size[0],)}

    __fallback__ = fallbacks.to_plain

    def to_plain(self):
        return self.rows

    def __plain_mask__(self):
        pos = torch.arange(self.shape[1], device=self.rows.device)
        return (pos[None, :] < self.lengths[:, None])[..., None].expand(self.shape)


class NoLinear(WrapperTensor):
    payload: torch.Tensor = inner()


def test_b_unsupported_op_from_a_decomposition_names_the_function():
    x = NoLinear(torch.randn(2, 3, 4))
    w = torch.randn(5, 4)
    with pytest.raises(UnsupportedOpError) as e:
        F.linear(x, w)
    msg = str(e.value)
    assert "decomposing torch.nn.functional.linear" in msg
    assert "@NoLinear.implements_torch_function(torch.nn.functional.linear)" in msg
    assert __file__ in msg  # where it was called
    with pytest.raises(UnsupportedOpError, match="decomposing torch.nn.functional.linear .*linear.py"):
        torch.nn.Linear(4, 5)(x)
    # An op called as itself names only itself.
    with pytest.raises(UnsupportedOpError) as e:
        torch.sin(x)
    assert "decomposing" not in str(e.value)


def test_b_to_plain_fallback_warns_for_ops_that_mix_padding():
    v = torch.randn(2, 4, 3)
    lengths = torch.tensor([4, 2])
    v[1, 2:] = 0
    x = Padded(v, lengths)
    with pytest.warns(PlainMaskWarning, match=r"Padded computes aten\.mean\.dim .*__plain_mask__"):
        got = x.mean(dim=1)
    # The warning is right: the fallback's mean divides row 1 by 4, not by its length 2.
    assert not torch.allclose(got[1], v[1, :2].mean(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.exp(x)  # pointwise: every position keeps to itself


# ---- (c) int() on a dynamic size inside a handler -----------------------------------------------


class Sized(WrapperTensor):
    payload: torch.Tensor = inner()

    __fallback__ = fallbacks.map_inner


@Sized.implements(aten.sin.default)
def _sin_int(func, types, args, kwargs):
    x = args[0]
    n = int(x.shape[0])  # the mistake: specializes the dynamic size
    return Sized(x.payload[:n].sin())


@Sized.implements(aten.cos.default)
def _cos_item(func, types, args, kwargs):
    x = args[0]
    n = int(x.payload.abs().sum() > 0)  # the mistake: a data-dependent value
    return Sized(x.payload[: n + 1].cos())


def _compile_marked(fn):
    torch._dynamo.reset()
    x = Sized(torch.randn(8, 3))
    torch._dynamo.mark_dynamic(x, 0)
    return torch.compile(fn, backend="aot_eager", fullgraph=True), x


def test_c_int_on_a_dynamic_size_in_a_handler_is_named():
    f, x = _compile_marked(lambda t: t.sin() * 2)
    # Turned into an error by the test suite's warning filter (and by -W error for users);
    # otherwise printed just before torch's ConstraintViolationError.
    with warnings.catch_warnings():
        warnings.simplefilter("error", SizeSpecializedWarning)
        with pytest.raises(Exception) as e:
            f(x)
    text = str(e.value)
    assert "SizeSpecializedWarning" in text or isinstance(e.value, SizeSpecializedWarning)
    assert "Sized's handler for aten.sin.default" in text and "_sin_int" in text
    assert "L['t'].size()[0] = 8" in text and "torch._check" in text


def test_c_data_dependent_guard_in_a_handler_is_named():
    f, x = _compile_marked(lambda t: t.cos() * 2)
    with pytest.raises(Exception) as e:
        f(x)
    chain = [e.value]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    text = " ".join(str(c) for c in chain)
    assert "SymbolicSizeError" in text or any(isinstance(c, SymbolicSizeError) for c in chain)
    assert "Sized's handler for aten.cos.default" in text and "_cos_item" in text


# ---- (d) a constructor call without size= -------------------------------------------------------


class Jagged(WrapperTensor):
    packed: torch.Tensor = inner()
    seq_offsets: torch.Tensor = inner(dtype=torch.int64)

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        B, L, D = outer_size  # the newcomer's unpacking
        return {"seq_offsets": (B + 1,)}


def test_d_missing_size_is_named():
    packed, offs = torch.randn(10, 4), torch.tensor([0, 3, 10])
    with pytest.raises(OuterArgumentError) as e:
        Jagged(packed, offs)
    msg = str(e.value)
    assert "Jagged(...) was called without size=" in msg and "(10, 4)" in msg and "size=" in msg
    assert isinstance(e.value, ConstructionError) and isinstance(e.value, ValueError)
    assert Jagged(packed, offs, size=(2, 7, 4)).shape == (2, 7, 4)


def test_from_parts_stride_defaults_to_the_outer_size_contiguous():
    packed, offs = torch.randn(10, 4), torch.tensor([0, 3, 10])
    x = Jagged.from_parts((packed, offs), size=(2, 7, 4))
    assert x.stride() == (28, 4, 1)  # row-major for the outer size, not the 2-d primary's (4, 1)
    y = Jagged.from_parts((packed, offs), x.__tensor_flatten__()[1], size=(2, 7, 4))
    assert y.stride() == x.stride() == torch.empty(2, 7, 4).stride()
