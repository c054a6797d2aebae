"""Layouts that shard one tensor dim over several mesh dims, on a (2, 2) mesh of 4 gloo
ranks: torch's nested ``[Shard(0), Shard(0)]`` and FSDP-over-TP's strided
``[_StridedShard(0, split_factor=2), Shard(0)]``, through distribute, redistribute (every
layout to every other, uneven sizes), full_tensor, gradients and the op rules; Partial
``distribute``; and sub-meshes (a rank outside the mesh holds an empty local). Each checked
against dense values and against torch's DTensor on the same layouts in the same world
(per-rank locals, collective counts). One spawned world for all."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _layouts_tasks as T

pytestmark = pytest.mark.dist

TIMEOUT = 300.0


def test_every_layout_redistributes_to_every_other_as_dtensor():
    # 14 layouts (simple, nested, strided, Partial) x 14 where one is nested or strided (the
    # simple pairs are test_mesh2d's), three shapes (two uneven, one with empty shards): the
    # full value and the gradient equal dense, the locals equal DTensor's and the
    # collectives are no more than DTensor's wherever DTensor itself is right.
    for r in world(4).run(T.redistribute_all, timeout=TIMEOUT):
        assert r["bad"] == [], r["bad"][:5]
        assert r["pairs"] == 300


def test_ops_on_nested_and_strided_layouts_match_dense():
    # Elementwise ops keep the layout (as DTensor's pointwise strategy); every other op
    # runs by its rule on the nearest layout it handles: values and gradients equal dense.
    r = world(4).run(T.ops, timeout=TIMEOUT)[0]
    for layout, pl in (("nested", "(Shard(0), Shard(0))"), ("strided", "(_StridedShard(dim=0, sf=2), Shard(0))"),
                       ("nested dim 1", "(Shard(1), Shard(1))")):
        for op in ("relu", "add same layout", "to float32"):
            assert r[f"{layout} {op}"] == pl, (layout, op, r[f"{layout} {op}"])
    # the nearest simple layouts: a nested dim keeps its first mesh dim, a strided one its TP shard
    assert r["nested matmul"] == "(Shard(0), Replicate())"
    assert r["strided matmul"] == "(Replicate(), Shard(0))"
    assert len(r) == 3 * len(T.OPS)


def test_in_place_ops_write_into_the_odd_layout():
    for r in world(4).run(T.inplace, timeout=TIMEOUT):
        for layout, (pl, setitem) in r.items():
            assert pl.count("Shard") == 2, (layout, pl)
            # a write into a slice that is a gathered copy raises (no silent lost write)
            assert setitem.startswith("raised: ShardedTensor cannot run aten.fill_"), (layout, setitem)


def test_sub_mesh_ranks_outside_hold_empty_locals_as_dtensor():
    # Upstream test_from_local_sub_mesh, test_default_value_sub_mesh and
    # test_redistribute_sub_mesh (test/distributed/tensor/test_dtensor.py), mesh [0, 2] of 4.
    results = world(4).run(T.sub_mesh, timeout=TIMEOUT)
    for rank, r in enumerate(results):
        assert r["kit"] == r["dtensor"], (rank, r)
        if rank in (1, 3):
            assert r["kit"]["from_local local"] == [] and r["kit"]["sum local"] == 0.0
            assert r["collectives"] == 0 and r["distribute local"] == [] and r["full"] == []
        else:
            assert r["kit"]["from_local size"] == (6, 4) and r["kit"]["sum local"] == 12.0
            assert r["full"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]


def test_fsdp_over_tp_parameters_stored_strided_train_as_dense():
    # parallelize (Colwise, Rowwise) on the tp mesh dim, each parameter stored
    # [_StridedShard(d, tp), Shard(d)] over (dp, tp) (uneven: 10 rows over 4 ranks), gathered
    # over dp in forward (DTensor's count), gradients reduce-scattered back strided.
    for r in world(4).run(T.fsdp_tp, timeout=TIMEOUT):
        strided = {"0.weight": "(_StridedShard(dim=0, sf=2), Shard(0))", "0.bias": "(_StridedShard(dim=0, sf=2), Shard(0))",
                   "2.weight": "(_StridedShard(dim=1, sf=2), Shard(1))", "2.bias": "(Shard(0), Replicate())"}
        assert r["stored"] == strided and r["grads"] == strided, r
        assert r["gathers"] <= r["dtensor gathers"] == 4, r


def test_upstream_nested_shard_checks_match_dtensor():
    # The upstream checks of [Shard(0), Shard(0)] (names in the keys; see _layouts_tasks.upstream)
    results = world(4).run(T.upstream, timeout=TIMEOUT)
    for r in results:
        for name in ("test_device_mesh_2d", "test_full_shard_math_ops", "compute_local_shape_and_global_offset",
                     "test_from_local_uneven_sharding"):
            kit, dt = r[name]
            assert kit == dt, (name, kit, dt)
        assert r["test_device_mesh_2d"][0] == (12, 3)
        for same, n, nt in r["test_redistribute_shard_dim_multi_dim_mesh"]:
            assert same and n <= nt, r["test_redistribute_shard_dim_multi_dim_mesh"]
        assert r["test_ordered_redistribute"] == [True, True, True]
        kit, dt, whole = r["_StridedShard docstring"]
        assert kit == dt and whole, r["_StridedShard docstring"]
    # the docstring's table: ranks 0..3 hold rows 0-1, 4-5, 2-3, 6-7
    assert [r["_StridedShard docstring"][0] for r in results] == [[0.0, 8.0], [32.0, 40.0], [16.0, 24.0], [48.0, 56.0]]


def test_odd_layouts_compile_once_with_aot_eager():
    for r in world(4).run(T.compiled, timeout=TIMEOUT):
        assert r == {"nested": 1, "strided": 1, "nested dim 1": 1,
                     "fsdp gather": (1, "(_StridedShard(dim=0, sf=2), Shard(0))")}, r
