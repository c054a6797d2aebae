"""A compiled function that returns a view of its input, on a 2-rank gloo world: values and
gradients against dense, eager and compiled, with the compiles counted (see _view_tasks);
and, on a one-rank mesh, the flatten round trip that carries the outer storage offset."""

from __future__ import annotations

import pytest
import torch

from kit_helpers.harness import world

from sharded import _view_tasks

from subclass_kit.ctx import ctx_of
from subclass_kit.sharded import MeshRef, Shard, ShardedTensor

TIMEOUT = 300.0

# A view whose replay is no chain of slices, selects and a permute (nor a diagonal, nor a
# compact block viewed): the regenerated output is strided out of the whole tensor (a copy
# marked as a gathered view), so it comes back Replicate where eager keeps the shard. Right
# values; the layout differs.
_REPLAYED_WHOLE = {"unfold S1"}


@pytest.fixture(scope="module")
def views():
    return world(2).run(_view_tasks.output_views, "aot_eager", timeout=TIMEOUT)[0]


@pytest.mark.dist
def test_every_output_view_matches_dense_compiled_once(views):
    # The task raised on any value or gradient that differs from dense; here: one graph
    # per case, the second call with new values did not recompile.
    assert set(views) == {f"{n} {_view_tasks._LABEL[p]}" for n, (_, pls) in _view_tasks.VIEWS.items() for p in pls}
    assert {k: v["frames"] for k, v in views.items() if v["frames"] != 1} == {}


@pytest.mark.dist
def test_output_views_keep_the_placements_eager_gives(views):
    differ = {k for k, v in views.items() if v["compiled"] != v["eager"]}
    assert differ == _REPLAYED_WHOLE, {k: views[k] for k in differ}
    assert views["rows S1"]["compiled"] == "(Shard(1),)"  # a true view: the shard stays
    assert views["rows, strided cols, select S2"]["compiled"] == "(Replicate(),)"  # gathered
    assert views["rows, flattened S1"]["compiled"] == "(Shard(1),)"  # x[1:3] viewed, replayed so


@pytest.mark.dist
def test_a_view_of_an_input_view_matches_dense_and_recompiles_per_input_offset():
    r = world(2).run(_view_tasks.input_views, "aot_eager", timeout=TIMEOUT)[0]
    # The input's outer offset is in its flattened ctx (dynamo guards it): x[1:5] and
    # x[2:6] of the same tensor compile once each, and both return the right elements.
    assert r == {"input view S1": 2, "input view S2": 2, "no_grad S2": 1}


@pytest.mark.dist
def test_dynamic_output_views_stay_dynamic_where_the_offset_is_the_locals():
    r = world(2).run(_view_tasks.dynamic_views, "aot_eager", timeout=TIMEOUT)[0]
    # The offset of x[:, 1:3] of a Shard(0) tensor is its local's for every size: carried as
    # "local", one graph. x[1:3] of a Shard(1) tensor sits at 6 * n globally and 3 * n in its
    # local: the flattened ctx holds the number, so each size compiles (right values).
    assert r == {"cols S0": 1, "last S1": 1, "rows S1": 3}


@pytest.mark.dist
@pytest.mark.slow
def test_output_views_inductor():
    only = ("rows S1", "rows, strided cols, select S2", "diagonal S1")
    r = world(2).run(_view_tasks.output_views, "inductor", only, timeout=TIMEOUT * 3)[0]
    assert set(r) == set(only)
    assert all(v["frames"] == 1 and v["compiled"] == v["eager"] for v in r.values()), r


def test_flatten_carries_a_nonzero_outer_offset_and_unflatten_restores_it():
    x = ShardedTensor.from_local(torch.arange(24.0).reshape(4, 6), MeshRef.local(), [Shard(1)])
    v = x[1:3, 2:]
    names, ctx = v.__tensor_flatten__()
    assert (ctx.storage_offset, v.storage_offset()) == (8, 8)
    assert ctx != ctx_of(v) and "storage_offset" not in dict(ctx_of(v).fields)
    u = ShardedTensor.__tensor_unflatten__({n: getattr(v, n) for n in names}, ctx, v.shape, v.stride())
    assert (u.storage_offset(), u.__tensor_flatten__()[1]) == (8, ctx)
    assert ctx_of(u) == ctx_of(v)  # the op caches see the same ctx
    # A view at offset 0 flattens to the instance's own ctx.
    assert x[:2].__tensor_flatten__()[1] is ctx_of(x)
    # as_strided names global elements, as on a dense tensor.
    d = torch.arange(24.0).reshape(4, 6)
    got = x.as_strided(v.shape, v.stride(), v.storage_offset())
    assert torch.equal(got.to_plain(), d.as_strided(v.shape, v.stride(), 8))


@pytest.mark.dist
def test_exported_views_match_dense_strict_and_nonstrict():
    r = world(2).run(_view_tasks.exported_views, timeout=TIMEOUT)[0]
    # The task raised on a value, stride or offset unlike dense. A view keeping the shard
    # keeps it; a gathering view is whole, as in eager.
    kept, gathered = "(Shard(1),)", "(Replicate(),)"
    assert r == {f"{v} {kind} {mode}": kept if v == "rows S1" else gathered
                 for v in _view_tasks._KEPT_AND_GATHERED for mode in ("nonstrict", "strict")
                 for kind in ("input", "param", "view param")}


@pytest.mark.dist
def test_a_view_across_a_graph_break_matches_dense_with_its_gradient():
    r = world(2).run(_view_tasks.views_across_a_graph_break, "aot_eager", timeout=TIMEOUT)[0]
    # Two frames each (before and after the break); the backward runs each frame's
    # compiled backward (the task raised on a wrong value or gradient).
    assert r == {f"{v} {src}": 2 for v in _view_tasks._KEPT_AND_GATHERED for src in ("input", "intermediate")}


@pytest.mark.dist
def test_dtype_views_match_dense_compiled_static_and_dynamic():
    r = world(2).run(_view_tasks.dtype_views, "aot_eager", timeout=TIMEOUT)[0]
    # Values, strides and offsets as dense (the task raised otherwise). Static: the second
    # size recompiles (as dense). Dynamic: one graph where the returned offset is the
    # local's for every size or zero; a Shard(1) or gathered view's offset is a number the
    # flattened ctx holds, so each size compiles.
    assert r == {
        "cols to int16 S0 dynamic=False": 2, "cols to int16 S0 dynamic=True": 1,
        "rows to int16 S1 dynamic=False": 2, "rows to int16 S1 dynamic=True": 2,
        "cols to float64 S2 dynamic=False": 2, "cols to float64 S2 dynamic=True": 2,
        "gathered to int32 S2 dynamic=False": 2, "gathered to int32 S2 dynamic=True": 2,
        "rows to int32 S1 dynamic=False": 2, "rows to int32 S1 dynamic=True": 2,
    }
