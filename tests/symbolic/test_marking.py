"""mark_dynamic / apply / marks under real dynamo: compile counts, symbols, ranges.

Each behaviour is shown beside what torch's own ``torch._dynamo.mark_dynamic`` does today.
"""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

import symbolic
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor
from symbolic import Dim, SubclassPolicy

ROWS = list(range(64, 321, 32))  # 64, 96, ..., 320: scale rows 2..10
W = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))


def block_scaled(rows, cols=8, seed=0):
    return BlockScaled.from_float(torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed + rows)))


def dequant_mm(x, w):
    return torch.mm(x.to_plain(), w)


def sweep(backend, mark, rows=ROWS, make=block_scaled, fn=dequant_mm):
    """Compile `fn` once, call it on each size (marked by `mark`), check against eager."""
    cnt = CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, backend=cnt, fullgraph=True)
    for r in rows:
        x = make(r)
        mark(x)
        torch.testing.assert_close(compiled(x, W), fn(x, W))
    return cnt


def wrapped_input(cnt, cls):
    """The fake wrapped input dynamo traced with (the placeholder's example value)."""
    (ev,) = [n.meta["example_value"] for n in cnt.graphs[0].graph.nodes
             if n.op == "placeholder" and isinstance(n.meta.get("example_value"), cls)]
    return ev


# ---- BlockScaled: one compile for the whole sweep ---------------------------------------


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_block_scaled_sweep_compiles_once(backend):
    cnt = sweep(backend, lambda x: symbolic.mark_dynamic(x, 0))
    assert cnt.frame_count == 1
    ev = wrapped_input(cnt, BlockScaled)
    # The scale's row count is a symbol of its own; the column dims stay static ints.
    assert isinstance(ev.shape[0], torch.SymInt) and isinstance(ev.qdata.shape[0], torch.SymInt)
    assert isinstance(ev.scale.shape[0], torch.SymInt)
    assert type(ev.qdata.shape[1]) is int and ev.qdata.shape[1] == 8
    assert type(ev.scale.shape[1]) is int and ev.scale.shape[1] == 1


def test_min_max_flow_through_the_relation_to_the_scale():
    cnt = sweep("aot_eager", lambda x: symbolic.mark_dynamic(x, 0, min=64, max=320))
    assert cnt.frame_count == 1
    ev = wrapped_input(cnt, BlockScaled)
    env = ev.scale.shape[0].node.shape_env
    scale_range = env.var_to_range[ev.scale.shape[0].node.expr]
    qdata_range = env.var_to_range[ev.qdata.shape[0].node.expr]
    assert (int(scale_range.lower), int(scale_range.upper)) == (2, 10)  # ceiling(s0/32) on [64, 320]
    assert (int(qdata_range.lower), int(qdata_range.upper)) == (64, 320)


def test_contrast_torch_rule_puts_the_rows_range_on_the_scale():
    # torch's rule mirrors the outer mark onto every same-rank inner, range included: the
    # scale's 2 rows are "not in range [64, 320]" and nothing compiles.
    with pytest.raises(ConstraintViolationError, match=r"2 not in range \[64, 320\]"):
        with symbolic._compat.torch_rule():
            sweep("aot_eager", lambda x: torch._dynamo.mark_dynamic(x, 0, min=64, max=320))
    # inner="same_dim" is torch's rule, so it fails the same way.
    torch._dynamo.reset()
    with pytest.raises(ConstraintViolationError, match=r"2 not in range \[64, 320\]"):
        sweep("aot_eager", lambda x: symbolic.mark_dynamic(x, 0, min=64, max=320, inner="same_dim"))
    # torch's own function on a class with __inner_shapes__ derives instead (issue 23): one
    # compile, with or without a range.
    torch._dynamo.reset()
    assert sweep("aot_eager", lambda x: torch._dynamo.mark_dynamic(x, 0, min=64, max=320)).frame_count == 1
    torch._dynamo.reset()
    assert sweep("aot_eager", lambda x: torch._dynamo.mark_dynamic(x, 0)).frame_count == 1


class RowScaled1D(torch.Tensor):
    """Throwaway torch-style subclass from the issue: qdata (M, 8), a 1-D scale (M,).

    No __inner_shapes__, no kit base: only torch's protocol.
    """

    @staticmethod
    def __new__(cls, qdata, scale, outer_size=None, outer_stride=None):
        size = qdata.size() if outer_size is None else outer_size
        stride = qdata.stride() if outer_stride is None else outer_stride
        return torch.Tensor._make_wrapper_subclass(cls, size, strides=stride, dtype=scale.dtype)

    def __init__(self, qdata, scale, outer_size=None, outer_stride=None):
        self.qdata, self.scale = qdata, scale

    def __tensor_flatten__(self):
        return ["qdata", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return RowScaled1D(inner["qdata"], inner["scale"], outer_size, outer_stride)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        raise NotImplementedError(func)


def row_scaled_1d(rows):
    g = torch.Generator().manual_seed(rows)
    return RowScaled1D(torch.randint(-127, 128, (rows, 8), dtype=torch.int8, generator=g), torch.rand(rows, generator=g))


def dequant_1d(x, w):
    return (x.qdata.float() * x.scale[:, None]) @ w


def test_contrast_torch_skips_a_lower_rank_inner_and_fails():
    # The reproduction: torch skips the 1-D scale, then qdata's dim 0 specializes.
    with pytest.raises(ConstraintViolationError, match=r"L\['x'\]\.qdata\.size\(\)\[0\]"):
        sweep("aot_eager", lambda x: torch._dynamo.mark_dynamic(x, 0), rows=[16, 24], make=row_scaled_1d, fn=dequant_1d)


def test_derived_covers_a_lower_rank_inner_without_inner_shapes():
    cnt = sweep("aot_eager", lambda x: symbolic.mark_dynamic(x, 0), rows=[16, 24, 40], make=row_scaled_1d, fn=dequant_1d)
    assert cnt.frame_count == 1
    assert symbolic.marks(row_scaled_1d(8)) == SubclassPolicy()  # marks live on the marked instance only
    x = row_scaled_1d(8)
    symbolic.mark_dynamic(x, 0)
    assert symbolic.marks(x) == SubclassPolicy(outer=[0], inner={"qdata": [0], "scale": [0]})


# ---- same_dim, none, per-inner overrides -------------------------------------------------


@pytest.mark.parametrize("kwargs", [{}, {"min": 4, "max": 300}], ids=["plain", "range"])
def test_same_dim_reproduces_torch_exactly(kwargs):
    ours, theirs = block_scaled(64), block_scaled(64)
    symbolic.mark_dynamic(ours, [0, 1], inner="same_dim", **kwargs)
    with symbolic._compat.torch_rule():  # torch's rule (its function alone now derives)
        torch._dynamo.mark_dynamic(theirs, [0, 1], **kwargs)
    assert symbolic.marks(ours) == symbolic.marks(theirs)
    assert symbolic.marks(ours).inner["scale"] == {0: Dim.dynamic(**kwargs), 1: Dim.dynamic(**kwargs)}
    # Nested: torch recurses into inner wrappers; so does same_dim.
    a, b = TwoTensor(block_scaled(64), block_scaled(64)), TwoTensor(block_scaled(64), block_scaled(64))
    symbolic.mark_dynamic(a, 0, inner="same_dim")
    with symbolic._compat.torch_rule():
        torch._dynamo.mark_dynamic(b, 0)
    assert symbolic.marks(a) == symbolic.marks(b)


def test_derived_differs_from_same_dim_where_it_should():
    x = block_scaled(64)
    derived = symbolic.plan(x, [0, 1], max=320)
    same = symbolic.plan(x, [0, 1], max=320, inner="same_dim")
    assert derived.inner["scale"] == {0: Dim.dynamic(max=10), 1: Dim.static()}
    assert same.inner["scale"] == {0: Dim.dynamic(max=320), 1: Dim.dynamic(max=320)}
    assert derived.inner["qdata"] == same.inner["qdata"] == {0: Dim.dynamic(max=320), 1: Dim.dynamic(max=320)}


def test_none_marks_only_the_outer_tensor():
    x = block_scaled(64)
    symbolic.mark_dynamic(x, 0, inner="none")
    assert symbolic.marks(x) == SubclassPolicy(outer=[0])
    assert not hasattr(x.qdata, "_dynamo_dynamic_indices") and not hasattr(x.scale, "_dynamo_dynamic_indices")


def test_per_inner_override_static_scale_recompiles_per_scale_size():
    rows = [64, 96, 128]
    cnt = sweep("aot_eager", lambda x: symbolic.mark_dynamic(x, 0, inner={"scale": {0: Dim.static()}}), rows=rows)
    assert cnt.frame_count == len(rows)  # a static scale dim: each new block count recompiles
    ev = wrapped_input(cnt, BlockScaled)
    assert isinstance(ev.qdata.shape[0], torch.SymInt)  # the un-overridden inner is still derived
    assert type(ev.scale.shape[0]) is int


def test_per_inner_override_auto_scale_compiles_once():
    x = block_scaled(64)
    p = symbolic.mark_dynamic(x, 0, inner={"scale": {0: Dim.auto()}})
    assert p == SubclassPolicy(outer={0: Dim.dynamic()}, inner={"qdata": [0], "scale": {0: Dim.auto()}})
    assert symbolic.marks(x) == p
    cnt = sweep("aot_eager", lambda x: symbolic.mark_dynamic(x, 0, inner={"scale": {0: Dim.auto()}}), rows=[64, 96, 128])
    assert cnt.frame_count == 1


# ---- min/max behave as torch's do on plain tensors ---------------------------------------


def _range_protocol(make, mark, fn):
    """Compile in range, call in range, call out of range marked and unmarked."""
    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=cnt, fullgraph=True)
    outcomes = []
    for rows, marked in [(64, True), (96, True), (160, False), (192, True)]:
        x = make(rows)
        if marked:
            mark(x)
        try:
            torch.testing.assert_close(compiled(x, W), fn(x, W))
            outcomes.append(("ok", cnt.frame_count))
        except ConstraintViolationError as e:
            outcomes.append(("ConstraintViolationError", str(e).splitlines()[0]))
    return outcomes


def test_min_max_match_torch_on_a_plain_tensor():
    plain = _range_protocol(
        lambda r: torch.randn(r, 8), lambda x: torch._dynamo.mark_dynamic(x, 0, min=64, max=128), lambda x, w: x @ w
    )
    torch._dynamo.reset()
    ours = _range_protocol(block_scaled, lambda x: symbolic.mark_dynamic(x, 0, min=64, max=128), dequant_mm)
    expected = [("ok", 1), ("ok", 1), ("ok", 2), ("ConstraintViolationError", "192 not in range [64, 128]")]
    assert plain == expected
    assert ours == expected


def test_dims_mapping_mixes_kinds_and_resolves_negative_dims():
    x = block_scaled(64)
    p = symbolic.mark_dynamic(x, {-2: Dim.dynamic(max=512), -1: Dim.static()})
    assert p.outer == {0: Dim.dynamic(max=512), 1: Dim.static()}
    assert p.inner["qdata"] == {0: Dim.dynamic(max=512), 1: Dim.static()}
    assert p.inner["scale"] == {0: Dim.dynamic(max=16), 1: Dim.static()}
    assert symbolic.marks(x) == p


# ---- nested: a TwoTensor of ScaledTensors ------------------------------------------------


def nested(rows):
    g = torch.Generator().manual_seed(rows)
    return TwoTensor(ScaledTensor.from_float(torch.randn(rows, 8, generator=g)),
                     ScaledTensor.from_float(torch.randn(rows, 8, generator=g)))


def nested_fn(x, w):
    y = x * 2
    return (y.a + y.b) @ w  # ops on ScaledTensors return dense tensors


LEAF = {"qdata": {0: Dim.dynamic()}, "scale": {0: Dim.dynamic(), 1: Dim.static()}}
RECURSIVE = SubclassPolicy(
    outer={0: Dim.dynamic()},
    inner={"a": SubclassPolicy(outer={0: Dim.dynamic()}, inner=LEAF),
           "b": SubclassPolicy(outer={0: Dim.dynamic()}, inner=LEAF)},
)


def test_nested_recursive_policy_compiles_once():
    cnt = sweep("aot_eager", lambda x: symbolic.apply(x, RECURSIVE), rows=[16, 24, 40], make=nested, fn=nested_fn)
    assert cnt.frame_count == 1
    ev = wrapped_input(cnt, TwoTensor)
    assert isinstance(ev.a.qdata.shape[0], torch.SymInt) and isinstance(ev.b.scale.shape[0], torch.SymInt)
    assert ev.a.scale.shape[1] == 1 and type(ev.a.qdata.shape[1]) is int


def test_nested_derived_plan_is_the_recursive_policy():
    assert symbolic.plan(nested(16), 0) == RECURSIVE
    x = nested(16)
    symbolic.mark_dynamic(x, 0)
    # A nested wrapper's own dim is marked maybe_mark_dynamic: torch fakeifies it from its
    # concrete size, so a strict mark there could only fail (see the contrast below).
    assert symbolic.marks(x).inner["a"].outer == {0: Dim.auto()}
    assert symbolic.marks(x).inner["a"].inner == SubclassPolicy(inner=LEAF).inner


def test_contrast_torch_rule_on_nested_subclass_fails():
    with pytest.raises(ConstraintViolationError, match=r"L\['x'\]\.a\.size\(\)\[0\]"):
        with symbolic._compat.torch_rule():
            sweep("aot_eager", lambda x: torch._dynamo.mark_dynamic(x, 0), rows=[16, 24], make=nested, fn=nested_fn)
    # torch's own function on the kit's classes derives the nested policy: one compile.
    torch._dynamo.reset()
    cnt = sweep("aot_eager", lambda x: torch._dynamo.mark_dynamic(x, 0), rows=[16, 24, 40], make=nested, fn=nested_fn)
    assert cnt.frame_count == 1


@pytest.mark.slow
def test_nested_recursive_policy_inductor():
    cnt = sweep("inductor", lambda x: symbolic.mark_dynamic(x, 0), rows=[16, 24, 40], make=nested, fn=nested_fn)
    assert cnt.frame_count == 1


# ---- apply is literal and all-or-nothing -------------------------------------------------


def test_apply_checks_everything_before_marking():
    x = block_scaled(64)
    bad = SubclassPolicy(outer=[0], inner={"qdata": [0], "scale": [5]})
    with pytest.raises(symbolic.PolicyError, match=r"x\.scale: dim 5 is out of range"):
        symbolic.apply(x, bad)
    assert symbolic.marks(x) == SubclassPolicy()


def test_marks_reads_torch_marks_set_by_torch():
    x = torch.ones(3, 4)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=9)
    torch._dynamo.mark_static(x, 1)
    assert symbolic.marks(x) == SubclassPolicy(outer={0: Dim.dynamic(min=2, max=9), 1: Dim.static()})
    y = torch.ones(3)
    torch._dynamo.maybe_mark_dynamic(y, 0)
    assert symbolic.marks(y).outer == {0: Dim.auto()}


def test_plain_tensor_mark_dynamic_is_torch_mark_dynamic():
    x, y = torch.ones(5, 2), torch.ones(5, 2)
    symbolic.mark_dynamic(x, 0, min=2, max=8)
    torch._dynamo.mark_dynamic(y, 0, min=2, max=8)
    assert {k: v for k, v in vars(x).items()} == {k: v for k, v in vars(y).items()}


def test_marking_inside_a_compiled_region_is_an_error():
    @torch.compile(backend="eager", fullgraph=True)
    def f(x):
        symbolic.mark_dynamic(x, 0)
        return x * 2

    with pytest.raises(Exception, match="forbidden callable"):
        f(torch.ones(3))


def test_mark_dynamic_reads_the_wrapper_once(monkeypatch):
    """One description per call: planning, the ctx check and the marks read the tensor
    through it, so each wrapper is flattened once (torch's marking hook likewise)."""
    from subclass_kit.examples import BlockScaled

    calls = []
    flatten = BlockScaled.__tensor_flatten__
    monkeypatch.setattr(BlockScaled, "__tensor_flatten__", lambda self: calls.append(1) or flatten(self))
    x = BlockScaled.from_float(torch.randn(64, 8))
    symbolic.mark_dynamic(x, 0)
    assert len(calls) == 1
    calls.clear()
    torch._dynamo.mark_dynamic(BlockScaled.from_float(torch.randn(64, 8)), 0)
    assert len(calls) == 1
