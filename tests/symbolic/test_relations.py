"""relations(): __inner_shapes__ evaluated on sympy symbols; inferred relations otherwise."""

import pytest
import sympy
import torch
from expecttest import assert_expected_inline
from torch.testing._internal.two_tensor import TwoTensor as TorchTwoTensor

import symbolic
from subclass_kit import WrapperTensor, fallbacks, inner, meta
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor
from symbolic import RelationError, ceil_div, relations, size_symbol

s0, s1 = size_symbol("", 0), size_symbol("", 1)


def rhs(eqs, name):
    """The right-hand side of the relation whose left side is the symbol `name`."""
    (e,) = [e for e in eqs if e.lhs.name == name]
    return e.rhs


def test_block_scaled_scale_is_ceiling_of_rows_over_block():
    eqs = relations(BlockScaled)
    assert rhs(eqs, "scale_0") == sympy.ceiling(s0 / 32)
    assert rhs(eqs, "qdata_0") == s0 and rhs(eqs, "scale_1") == 1
    assert_expected_inline(str(eqs), """[Eq(qdata_0, s0), Eq(qdata_1, s1), Eq(scale_0, ceiling(s0/32)), Eq(scale_1, 1)]""")
    # The relation is an equation in the outer size: it holds on every row count.
    for rows in (1, 31, 32, 33, 320):
        assert rhs(eqs, "scale_0").subs(s0, rows) == -(-rows // 32)


def test_scaled_tensor_qdata_and_scale_follow_rows():
    eqs = relations(ScaledTensor)
    assert rhs(eqs, "qdata_0") == s0 and rhs(eqs, "scale_0") == s0 and rhs(eqs, "scale_1") == 1


def test_instance_uses_its_own_meta_values():
    x = BlockScaled.from_float(torch.randn(70, 8), block=16)
    assert rhs(relations(x), "scale_0") == sympy.ceiling(s0 / 16)
    assert rhs(relations(BlockScaled), "scale_0") == sympy.ceiling(s0 / 32)  # class: the default


class Idioms(WrapperTensor):
    """Throwaway: __inner_shapes__ written with the idioms people actually use."""

    q: torch.Tensor = inner()
    s: torch.Tensor = inner()
    pad: torch.Tensor = inner()
    block: int = meta(default=8)
    __fallback__ = fallbacks.map_inner

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        rows, cols = outer_size
        return {
            "q": ((rows * cols) // cols, cols + 0),  # cancels to rows, cols
            "s": (-(-rows // ctx.block), 2 * cols - cols),  # the ceil-div idiom without ceil_div
            "pad": (ceil_div(rows, ctx.block) * ctx.block, 1),  # rows padded up to a block
        }


def test_sympy_simplification_of_common_idioms():
    eqs = relations(Idioms, ndim=2)
    assert rhs(eqs, "q_0") == s0 and rhs(eqs, "q_1") == s1
    assert rhs(eqs, "s_0") == sympy.ceiling(s0 / 8) and rhs(eqs, "s_1") == s1
    assert rhs(eqs, "pad_0") == 8 * sympy.ceiling(s0 / 8)
    x = Idioms(torch.ones(20, 3), torch.ones(3, 3), torch.ones(24, 1))
    assert [str(e) for e in relations(x)] == [str(e) for e in eqs]


def test_inferred_same_size_relations_for_classes_without_inner_shapes():
    x = TorchTwoTensor(torch.ones(6, 4), torch.ones(6, 4))
    assert_expected_inline(str(relations(x)), """[Eq(a_0, s0), Eq(a_1, s1), Eq(b_0, s0), Eq(b_1, s1)]""")
    with pytest.raises(TypeError, match="no __inner_shapes__"):
        relations(TorchTwoTensor)


def test_nested_relations_are_in_the_root_symbols():
    x = TorchTwoTensor(BlockScaled.from_float(torch.randn(64, 8)), BlockScaled.from_float(torch.randn(64, 8)))
    eqs = relations(x)
    assert rhs(eqs, "a_0") == s0
    assert rhs(eqs, "a_scale_0") == sympy.ceiling(s0 / 32)
    assert rhs(eqs, "b_qdata_1") == s1
    kit = TwoTensor(ScaledTensor.from_float(torch.randn(5, 3)), ScaledTensor.from_float(torch.randn(5, 3)))
    assert rhs(relations(kit), "b_scale_0") == s0


def test_unrelated_inner_dims_get_no_relation():
    # An inner whose dim 0 differs from the outer's on the example: nothing is inferred.
    x = TorchTwoTensor(torch.ones(6, 4), torch.ones(6, 4))
    x.a = torch.ones(3, 4)  # contrived, but only __tensor_flatten__ is read
    names = [e.lhs.name for e in relations(x)]
    assert "a_0" not in names and "a_1" in names


def test_symbol_naming_scheme():
    assert [str(size_symbol("", 0)), str(size_symbol("scale", 1)), str(size_symbol("a.scale", 0))] == [
        "s0",
        "scale_1",
        "a_scale_0",
    ]
    assert size_symbol("", 0).is_positive and size_symbol("", 0).is_integer


class Branchy(WrapperTensor):
    """Throwaway: an __inner_shapes__ that tests a size in Python."""

    q: torch.Tensor = inner()
    s: torch.Tensor = inner()
    __fallback__ = fallbacks.map_inner

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        rows, cols = outer_size
        return {"q": (rows, cols), "s": (rows if rows > 16 else 16, 1)}


def test_branchy_inner_shapes_is_a_relation_error():
    with pytest.raises(RelationError) as e:
        relations(Branchy, ndim=2)
    assert isinstance(e.value, ValueError)
    assert "Branchy.__inner_shapes__ branches on a size" in str(e.value)
    assert "sym_max" in str(e.value)


def test_instance_contradicting_inner_shapes_is_reported():
    x = ScaledTensor.from_float(torch.randn(4, 3))
    # Simulate a broken instance (declared fields are read-only, so past the guard on purpose);
    # only attributes are read.
    x.__dict__["scale"] = torch.ones(5, 1)
    with pytest.raises(RelationError) as e:
        relations(x)
    assert_expected_inline(
        str(e.value),
        """x.scale.size(0) is 5 but ScaledTensor.__inner_shapes__ says s0 = 4 for the outer size (4, 3). Fix the instance or __inner_shapes__.""",
    )


def test_class_without_samples_needs_ndim():
    with pytest.raises(TypeError, match="ndim="):
        relations(Branchy)


def test_size_sources_read_relations_against_an_instance():
    x = TorchTwoTensor(BlockScaled.from_float(torch.randn(70, 8)), BlockScaled.from_float(torch.randn(70, 8)))
    srcs = symbolic.size_sources(x)
    assert srcs[size_symbol("a.scale", 0)].name_for("x") == "L['x'].a.scale.size()[0]"
    values = {sym: src(x) for sym, src in srcs.items()}
    # Every relation holds when each symbol is replaced by the size its source fetches.
    for eq in relations(x):
        assert eq.lhs.xreplace(values) == eq.rhs.xreplace(values), eq
    assert values[size_symbol("a.scale", 0)] == 3
