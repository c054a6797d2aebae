"""Op and metadata gaps of issue 12 on a 2-rank gloo world, each against dense: backward
through indexing (the ``*_backward`` and ``*_scatter`` ops autograd and functionalization
emit for views), the global strides of ``contiguous()``/``clone()``, and a property test
that every op family gives the strides the dense tensor would have; placements and meshes
read as compile-time constants, guarded by value."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _gap_tasks

pytestmark = pytest.mark.dist

TIMEOUT = 200.0


def test_backward_through_views_eager_and_compiled():
    results = world(2).run(_gap_tasks.backward_through_views, "aot_eager", timeout=TIMEOUT)
    assert all(r == results[0] for r in results)
    # One graph per placement: slice_backward & co. trace without a graph break.
    assert results[0]["frames"] == {"Shard(0)": 1, "Shard(1)": 1, "Replicate()": 1}
    # The op is linear in the gradient: a pending sum is not reduced to place it.
    assert results[0]["partial slice_backward"] == "(Partial('sum'),)"


def test_ops_along_dims_and_by_positions_eager_and_compiled():
    results = world(2).run(_gap_tasks.backward_through_positions, "aot_eager", timeout=TIMEOUT)
    assert all(r == results[0] for r in results)
    summary = results[0]
    assert summary["frames"] == {"Shard(0)": 1, "Shard(1)": 1, "Replicate()": 1}
    kept = summary["kept"]
    # Shards on dims the op does not work along stay where they are (no gather)...
    assert kept["cumsum 1 of Shard(0)"] == kept["flip 1 of Shard(0)"] == "(Shard(0),)"
    assert kept["max dim 0 of Shard(1)"] == "(Shard(0),)"  # shifted past the removed dim
    assert kept["pad last of Shard(0)"] == kept["index_select 1 of Shard(0)"] == "(Shard(0),)"
    # ...a shard on the dim it works along, or any op by global positions, is made whole.
    assert kept["cumsum 0 of Shard(0)"] == kept["tril of Shard(1)"] == "(Replicate(),)"
    assert kept["index of Shard(1)"] == "(Replicate(),)"
    # (gather along dim 1 addresses dim 0 by position: its shard stays, the index cut alike)
    assert kept["gather 1 of Shard(0)"] == "(Shard(0),)"
    # In place by positions into a shard: computed whole, written back, placements kept.
    assert summary["inplace into shard"] == "(Shard(0),)"


def test_writes_into_views_eager_and_compiled():
    (summary, _) = world(2).run(_gap_tasks.setitem, "aot_eager", timeout=TIMEOUT)
    for key, v in summary.items():
        if "Shard(0)" in key and key.startswith("rows") or "Shard(1)" in key and key.startswith("col"):
            assert v == "raises", key  # the written dim is sharded: a named error, not a lost write
        else:
            assert v in ("ok", 1), key


def test_contiguous_of_permuted_has_dense_strides():
    (frames, _) = world(2).run(_gap_tasks.contiguous_strides, "aot_eager", timeout=TIMEOUT)
    assert frames == {"Shard(0)": 1, "Shard(1)": 1, "Replicate()": 1}


def test_every_op_family_keeps_dense_strides():
    results = world(2).run(_gap_tasks.strides_property, 8, timeout=TIMEOUT)
    assert results[0] == results[1]
    assert all(n > 0 for n in results[0].values()), results[0]


def test_max_and_min_over_a_dim_smaller_than_the_mesh_match_dense_without_hanging():
    results = world(2).run(_gap_tasks.reductions_of_empty_shards, timeout=TIMEOUT)
    assert results[0]["local numel torch.float32"] + results[1]["local numel torch.float32"] == 6
    assert 0 in (results[0]["local numel torch.float32"], results[1]["local numel torch.float32"])
    assert results[0]["amax torch.float32"] == "(Partial('max'),)"


def test_fast_paths_on_a_local_shorter_than_its_global_dim_match_dense():
    # A shard's local is 1 long where the global dim is 2 (and 0 long where it is 1): the
    # planned fast paths run on the local, and must not take its size for the global one.
    results = world(2).run(_gap_tasks.short_local_views, timeout=TIMEOUT)
    assert results[0] == results[1]
    assert results[0]["squeeze() n=2"] == ["(Shard(1),)"]  # only the global size-1 dim goes
    assert len(results[0]) == 3 * len(_gap_tasks.SHORT_LOCAL_OPS)


@pytest.mark.slow
def test_backward_through_views_inductor():
    results = world(2).run(_gap_tasks.backward_through_views, "inductor", ("Shard(1)",), timeout=TIMEOUT * 2)
    assert results[0]["frames"] == {"Shard(1)": 1}


def test_placements_and_mesh_are_compile_time_constants():
    (summary, _) = world(2).run(_gap_tasks.compile_constants, timeout=TIMEOUT)
    assert summary["placements frames"] == 3  # Shard(0), Shard(1), Replicate(): guarded by value
    assert summary["hook frames"] == 1
    # A new but equal DeviceMesh is guarded by value, as DTensor's is: no more compiles than DTensor.
    assert summary["kit frames over 4 new meshes"] == summary["dtensor frames over 4 new meshes"] == 1


def test_redistribute_async_op():
    (summary, _) = world(2).run(_gap_tasks.async_redistribute, timeout=TIMEOUT)
    assert summary == {
        "Shard(0)->Replicate() local": ("AsyncCollectiveTensor", True),
        "Shard(0)->Shard(1) local": ("AsyncCollectiveTensor", True),  # gather, then a chunk (a view)
        "Partial('sum')->Replicate() local": ("AsyncCollectiveTensor", True),
        "compiled frames": 1,
    }
