"""``symbolic`` and torch's own marking functions on a QLoRA-style NF4 weight (issue 23, item 3).

Every inner tensor of ``kit_helpers.nf4.NF4`` is flat, its size ``rows * cols`` over a
constant, so torch's same-rank rule gives none of them a mark. Before this change:
``plan(w, 0, min=256, max=4096)`` was refused ("spans [0, inf]") although dim 1 is static,
a 128-row weight (one double-quant factor) compiled into torch's raw
ConstraintViolationError, a size kept in meta warned nothing, and
``torch._dynamo.mark_dynamic`` on a kit class ended in ConstraintViolationError.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import symbolic
from kit_helpers.nf4 import BLOCK, SCALER_BLOCK, NF4, NF4WithBlocks, weight
from subclass_kit.examples import BlockScaled, TwoTensor
from symbolic import CtxPinsShapeWarning, Dim, PolicyError

X = torch.randn(4, 128, generator=torch.Generator().manual_seed(0))


def _linear(w, x):
    return x @ w.to_plain().t()


def test_a_range_on_one_dim_takes_the_other_dims_static_sizes():
    w = weight(256)
    p = symbolic.plan(w, 0, min=256, max=4096)
    cols = w.shape[1]
    assert p.inner["qdata"] == {0: Dim.dynamic(min=256 * cols // 2, max=4096 * cols // 2)}
    assert p.inner["scalers"] == {0: Dim.dynamic(min=256 * cols // BLOCK, max=4096 * cols // BLOCK)}
    assert p.inner["factors"] == {0: Dim.dynamic(min=256 * cols // (BLOCK * SCALER_BLOCK),
                                                 max=4096 * cols // (BLOCK * SCALER_BLOCK))}


@pytest.mark.parametrize("mark", ["symbolic", "torch"])
def test_a_sweep_compiles_once_with_either_marking_function(mark):
    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(_linear, backend=cnt, fullgraph=True)
    for rows in (256, 384, 512, 768):
        w = weight(rows)
        # No range: NF4 only exists for rows * cols a multiple of 64 * 256, and dynamo
        # reports its own divisibility guard as a violation of any explicit range.
        if mark == "symbolic":
            symbolic.mark_dynamic(w, 0)
        else:
            torch._dynamo.mark_dynamic(w, 0)
        torch.testing.assert_close(f(w, X), _linear(w, X))
    assert cnt.frame_count == 1
    assert symbolic.marks(w) == symbolic.plan(weight(768), 0)


@pytest.mark.parametrize("mark", ["symbolic", "torch"])
def test_a_derived_size_of_one_is_refused_before_compiling(mark):
    w = weight(128)  # one double-quant factor: factors.size(0) == 1
    assert tuple(w.factors.shape) == (1,)
    fn = symbolic.mark_dynamic if mark == "symbolic" else torch._dynamo.mark_dynamic
    with pytest.raises(PolicyError, match=r"x\.factors\.size\(0\) = floor\(s0\*s1/16384\) is 1 on this instance"):
        fn(w, 0)
    assert symbolic.marks(w) == symbolic.SubclassPolicy({}, {})  # nothing marked
    # The fix the message names: Dim.auto() gives one specialized graph, then one for the rest.
    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(_linear, backend=cnt, fullgraph=True)
    for rows in (128, 256, 384, 512):
        w = weight(rows)
        torch._dynamo.maybe_mark_dynamic(w, 0)
        torch.testing.assert_close(f(w, X), _linear(w, X))
    assert cnt.frame_count == 2


@pytest.mark.parametrize("mark", ["symbolic", "torch"])
def test_a_size_kept_in_meta_is_named(mark):
    w = weight(256, cls=NF4WithBlocks)
    fn = symbolic.mark_dynamic if mark == "symbolic" else torch._dynamo.mark_dynamic
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(w, 0)
    pins = [c for c in caught if c.category is CtxPinsShapeWarning]
    assert pins and f"ctx.n_blocks = {w.n_blocks}" in str(pins[0].message)
    assert pins[0].filename == __file__  # points at the caller's line
    # ... and it is right: every size is a new ctx, so every size recompiles.
    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(_linear, backend=cnt, fullgraph=True)
    for rows in (256, 384):
        w = weight(rows, cls=NF4WithBlocks)
        with pytest.warns(CtxPinsShapeWarning, match="ctx.n_blocks"):
            torch._dynamo.maybe_mark_dynamic(w, 0)
        torch.testing.assert_close(f(w, X), _linear(w, X))
    assert cnt.frame_count == 2


def test_no_meta_warning_when_an_inner_size_follows_the_outer_one():
    with warnings.catch_warnings():
        warnings.simplefilter("error", CtxPinsShapeWarning)
        symbolic.mark_dynamic(weight(256), 0)
        torch._dynamo.mark_dynamic(BlockScaled.from_float(torch.randn(64, 8)), 1)
        torch._dynamo.mark_dynamic(TwoTensor(torch.ones(4, 2), torch.ones(4, 2)), 0)


def test_torch_mark_dynamic_on_a_kit_class_derives_the_inner_marks():
    x = BlockScaled.from_float(torch.randn(96, 8))
    torch._dynamo.mark_dynamic(x, 0, min=64, max=320)
    assert symbolic.marks(x) == symbolic.plan(BlockScaled.from_float(torch.randn(96, 8)), 0, min=64, max=320)
    # mark_static and maybe_mark_dynamic derive too
    y = BlockScaled.from_float(torch.randn(96, 8))
    torch._dynamo.maybe_mark_dynamic(y, 0)
    assert symbolic.marks(y).inner == {"qdata": {0: Dim.auto()}, "scale": {0: Dim.auto(), 1: Dim.static()}}
    z = BlockScaled.from_float(torch.randn(96, 8))
    torch._dynamo.mark_static(z, 0)
    assert symbolic.marks(z).inner == {"qdata": {0: Dim.static()}, "scale": {0: Dim.static(), 1: Dim.static()}}


def test_torchs_rule_stays_for_same_dim_and_for_foreign_classes():
    from torch.testing._internal.custom_tensor import CustomTensorPlainOut

    x = BlockScaled.from_float(torch.randn(96, 8))
    symbolic.mark_dynamic(x, 0, max=320, inner="same_dim")
    assert symbolic.marks(x).inner["scale"] == {0: Dim.dynamic(max=320)}  # torch's mirror
    t = CustomTensorPlainOut(torch.ones(4, 2), torch.ones(3, 2))  # no __inner_shapes__
    torch._dynamo.mark_dynamic(t, 0)
    assert symbolic.marks(t).inner == {"elem1": {0: Dim.dynamic()}, "elem2": {0: Dim.dynamic()}}


def test_a_derived_size_kept_static_is_noted_and_recompiles_when_it_grows():
    x = BlockScaled.from_float(torch.randn(32, 8))  # one scale row
    symbolic.mark_dynamic(x, 0)
    (note,) = symbolic.describe(x).notes()
    assert note.startswith("x.scale dim 0 = ceiling(s0/32) = 1 on this instance: kept static")
    assert "a size >= 2 will recompile" in note
    assert symbolic.describe(x, symbolic.plan(x, 0)).notes() == [note]
    assert symbolic.describe(BlockScaled.from_float(torch.randn(96, 8)), symbolic.plan(
        BlockScaled.from_float(torch.randn(96, 8)), 0)).notes() == []
    # ... and it is right: sizes with one scale row share the graph, two rows recompile.
    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda t: t.to_plain() * 2, backend=cnt, fullgraph=True)
    for rows, frames in ((32, 1), (16, 1), (64, 2)):
        t = BlockScaled.from_float(torch.randn(rows, 8))
        if rows == 32:
            symbolic.mark_dynamic(t, 0)
        torch.testing.assert_close(f(t), t.to_plain() * 2)
        assert cnt.frame_count == frames, rows


def test_a_range_on_a_whole_block_layout_compiles_once_over_the_multiples_in_range():
    # Dynamo guards rows % 128 == 0 (one double-quant factor per 128 rows of 128 columns)
    # and reported that guard as a violation of the range: ConstraintViolationError.
    p = symbolic.plan(weight(256), 0, min=256, max=4096)
    assert p.outer == {0: Dim.dynamic()}  # the range rides on the inner sizes
    assert p.inner["factors"] == {0: Dim.dynamic(min=2, max=32)}
    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(_linear, backend=cnt, fullgraph=True)
    for rows in (256, 384, 4096):
        w = weight(rows)
        symbolic.mark_dynamic(w, 0, min=256, max=4096)
        torch.testing.assert_close(f(w, X), _linear(w, X))
    assert cnt.frame_count == 1
    w = weight(4224)  # outside the range: the inner ranges' guards fail, so it recompiles
    torch.testing.assert_close(f(w, X), _linear(w, X))
    assert cnt.frame_count == 2


def test_torch_mark_dynamic_with_a_range_on_a_whole_block_layout_is_refused_naming_the_divisor():
    w = weight(256)
    with pytest.raises(PolicyError, match=r"multiple of 128.*symbolic\.mark_dynamic\(x, 0, min=256, max=4096\)"):
        torch._dynamo.mark_dynamic(w, 0, min=256, max=4096)
    assert symbolic.marks(w) == symbolic.SubclassPolicy({}, {})  # nothing marked
    # A range that does not meet the blocks is not affected.
    x = BlockScaled.from_float(torch.randn(96, 8))
    torch._dynamo.mark_dynamic(x, 0, min=64, max=320)
    assert symbolic.marks(x).outer == {0: Dim.dynamic(min=64, max=320)}
