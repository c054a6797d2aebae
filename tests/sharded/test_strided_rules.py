"""A view merging a shard after other dims keeps it as a _StridedShard (and viewed back, it is
a Shard again), and mm keeps a strided row shard, with no collective (as DTensor; issue 29's ported DTensor view and matrix
tests): 2 gloo ranks."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world
from subclass_kit.sharded import Replicate, Shard, _StridedShard

from sharded import _strided_rules_tasks as T

pytestmark = pytest.mark.dist


def test_flatten_after_other_dims_gives_a_strided_shard():
    for r in world(2).run(T.flatten_to_strided, timeout=120):
        assert r["even"] == ((_StridedShard(0, split_factor=6),), 0, (12, 3))
        assert r["uneven"] == ((_StridedShard(0, split_factor=6),), 0)  # (each block of 3 rows chunked alike)


def test_mm_keeps_a_strided_row_shard():
    for r in world(2).run(T.mm_keeps_strided_rows, timeout=120):
        assert r["replicate"] == ((_StridedShard(0, split_factor=2),), 0)
        assert r["sharded"] != (_StridedShard(0, split_factor=2),)


def test_flatten_on_a_2x2_mesh_strides_after_the_leading_shard():
    for r in world(4).run(T.flatten_2x2, timeout=120):
        assert r["S0,S1"] == ((Shard(0), _StridedShard(0, split_factor=4)), 0)
        assert r["S1,S2"] == ((_StridedShard(0, split_factor=6), Shard(1)), 0)



def test_unflatten_of_a_strided_shard_is_a_shard_again():
    for r in world(2).run(T.unflatten_roundtrip, timeout=120):
        assert r["1d"] == ((Shard(1),), 0)
        assert r["misaligned"][0] == (Replicate(),) and r["misaligned"][1] > 0
    for r in world(4).run(T.unflatten_roundtrip_2x2, timeout=120):
        assert r["S1,S2"] == r["S1,S2 merged"] == ((Shard(1), Shard(2)), 0)
        assert r["R,S1"] == ((Replicate(), Shard(1)), 0)
